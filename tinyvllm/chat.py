"""Chat, apart from HTTP (vLLM's chat_utils, tool parsers and reasoning parsers): an OpenAI chat request -> the prompt and what the sampler
must produce, and the model's text -> reasoning, content and tool_calls, as it streams. The parsers are tinygrad's own
(tinygrad.llm.serve): StreamRouter splits <think> and <tool_call> regions as text streams in, holding back a tag split across pieces, and
parse_tool_call reads Hermes JSON and Qwen3-Coder XML calls.

The chat template says what the model was taught: Hermes <tool_call> tags (Qwen, Hermes) or Llama 3.x's bare JSON calls, and whether it
reasons inside <think> tags (Qwen3, DeepSeek-R1 distills). Only templates that mention them get tools or reasoning."""
import contextlib, copy, json, re, uuid, jinja2, llguidance
from tinygrad.llm.serve import StreamRouter, normalize_messages, parse_tool_call
from tinyvllm.tokenizer import ParamError, compile_grammar

# forced arguments take the layout templates render them in (tojson is json.dumps), the one the model learned
ARGUMENTS_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# the most any request field may nest and hold (serve.py checks every field; tool-call arguments sent as JSON text, once parsed): copies,
# chat templates and grammars recurse, and tinygrad lifts Python's recursion limit to 10,000, so json.loads hands back values 5,000 deep
# that overflow them. Tools' JSON schemas need far less. The innermost values count as a level: [[0]] nests 3 deep.
MAX_DEPTH, MAX_VALUES = 32, 1 << 16

def json_size(v, depth:int=MAX_DEPTH) -> int:
  """How many values a JSON value holds; nested over `depth` levels, more than any bound."""
  return 2**62 if depth <= 0 else 1 + sum(json_size(x, depth - 1) for x in (v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()))

# deltas add up: text concatenates, tool calls append; empty values add nothing
def merge(message:dict, delta:dict): message.update({key: message.get(key, value[:0]) + value for key, value in delta.items() if value})

def checked_messages(messages) -> list[dict]:
  """OpenAI's messages: content is a string or text parts, or null (as "") beside an assistant's tool calls, whose arguments (a JSON string
  from clients) become the dicts chat templates expect, as vLLM does. Their results come back as role "tool" messages. An earlier turn's
  reasoning (interleaved thinking), sent under vLLM's name `reasoning` or DeepSeek's `reasoning_content`, reaches the template under
  both, as vLLM passes it (Qwen3's template reads reasoning_content)."""
  text = lambda c: c is None or isinstance(c, str) or isinstance(c, list) and all(p["type"] == "text" and isinstance(p["text"], str) for p in c)
  call = lambda c: isinstance(c["function"]["name"], str) and isinstance(a := c["function"]["arguments"], dict) and json_size(a) <= MAX_VALUES
  thought = lambda m, both=("reasoning", "reasoning_content"): {k: m[n] for n in both[::-1] if m.get(n) is not None for k in both}
  # a message of the wrong shape falls through to the error, as do arguments sent as JSON text too deep for json.loads itself
  with contextlib.suppress(TypeError, KeyError, AttributeError, RecursionError):
    # the contents are checked before any copy or template
    if messages and all(isinstance(m["role"], str) and text(m.get("content")) for m in messages):
      # in place; the request stays as it came
      normalize_messages(messages := [m | thought(m) for m in copy.deepcopy(messages)])
      if all(call(c) for m in messages for c in m.get("tool_calls") or []): return [m | {"content": m.get("content") or ""} for m in messages]
  raise ParamError("messages", "must be a non-empty list of {'role': str, 'content': str or text parts (or null beside JSON tool_calls)}")

def request(tokenizer, grammar_tokenizer, body:dict) -> tuple[list[int], dict | None, "OutputParser", llguidance.LLMatcher | None]:
  """The prompt (tools reach the template as transformers passes them; tool_choice "none" passes none); what the sampler must produce:
  response_format, vLLM's structured_outputs, or a forced tool call (tool_choice "required" or a named function, as vLLM does); the
  OutputParser of its one choice; and that output's grammar, compiled here, once (the engine takes this matcher as it is), so that a bad
  one is a 400 before any stream and the compile runs off the engine thread."""
  tool_format = "hermes" if "<tool_call>" in (template := tokenizer.chat_template_text) else "json" if '"parameters"' in template else None
  tools, choice, template_kwargs = body.get("tools"), body.get("tool_choice"), body.get("chat_template_kwargs") or {}
  try: schemas = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"} for t in tools if t["type"] == "function"}
  # tools of the wrong shape, or left out (None): no schemas
  except (TypeError, KeyError, AttributeError): schemas = {}
  # as OpenAI and vLLM: tools: [] is refused (no tools is tools left out), and tool_choice other than none needs tools; null is auto
  if tools is not None and not (0 < len(schemas) == len(tools) and all(isinstance(n, str) and isinstance(s, dict) for n, s in schemas.items())):
    raise ParamError("tools", "are 1+ {'type': 'function', 'function': {'name': str, 'parameters': schema}}, names distinct")
  named = choice["function"].get("name") if isinstance(choice, dict) and isinstance(choice.get("function"), dict) else None
  if not (choice in (None, "none") or tools and choice in ("auto", "required") or isinstance(named, str) and named in schemas):
    raise ParamError("tool_choice", "must be none, or (with tools) auto, required or {'function': {'name': one of the tools}}")
  if (calls := bool(tools) and choice != "none") and tool_format is None:
    raise ParamError("tools", "need a chat template with Hermes <tool_call> tags or Llama 3's JSON calls; this model's has neither")
  if own := {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"} & set(template_kwargs):
    raise ParamError("chat_template_kwargs", f"may not set {sorted(own)}")
  messages = checked_messages(body.get("messages"))
  try: prompt = tokenizer.encode_chat(messages, **template_kwargs, **({"tools": tools} if calls else {}))
  except Exception as e:
    # the template's own words are for the client; a tokenizer's C++ text (lone surrogates, ...) is not
    raise ParamError("messages", f"were refused by the chat template: {e}" if isinstance(e, jinja2.TemplateError) else "don't tokenize") from None
  if not prompt: raise ParamError("messages", "render an empty prompt")
  # DeepSeek-R1's form: the template opens <think> in the prompt, so the output starts inside the reasoning
  thinking = "<think>" in template and tokenizer.hf.decode(prompt[-8:], skip_special_tokens=False).rstrip().endswith("<think>")
  forced, structured = {named: schemas[named]} if named else schemas if choice == "required" else None, body.get("structured_outputs")
  # parallel_tool_calls false: at most one call, as vLLM does (the parser drops later ones; a forced call's grammar ends after one)
  parallel = body.get("parallel_tool_calls") is not False
  kind = (fmt := body.get("response_format") or {"type": "text"}).get("type")
  if kind not in ("text", "json_object", "json_schema"): raise ParamError("response_format", "type must be text, json_object or json_schema")
  # a forced call is the whole reply: its grammar replaces response_format and structured_outputs, as vLLM's does; vLLM refuses these
  # structured outputs beside a named function
  if named and {"json", "regex", "choice"} & set(structured or {}): raise ParamError("structured_outputs", "cannot constrain a named tool call")
  # OpenAI's response_format as vLLM's structured outputs
  try:
    if forced: structured = {"grammar": tool_grammar(tokenizer, tool_format, forced, thinking, parallel=parallel and not named)}
    elif kind != "text": structured = {"json_object": True} if kind == "json_object" else {"json": fmt["json_schema"]["schema"]}
    matcher = structured and compile_grammar(structured, grammar_tokenizer)
  except (ParamError, KeyError, TypeError) as e:
    # named after the field it came from
    raise ParamError("tools" if forced else "structured_outputs" if kind == "text" else "response_format", f"is not valid ({e})") from None
  return prompt, structured, OutputParser(calls and tool_format, "<think>" in template, thinking, parallel), matcher

def tool_grammar(tokenizer, tool_format:str, schemas:dict[str, dict], thinking:bool, parallel:bool) -> str:
  """Lark for llguidance that admits only calls of these functions in the template's markup (one, or several if parallel); %json embeds
  each one's parameters schema. Tags that are tokens of the vocabulary are written bare, so that they match those tokens."""
  tag, key = lambda text: text if text in tokenizer.specials else json.dumps(text), "arguments" if tool_format == "hermes" else "parameters"
  # no properties beyond a tool's own unless its schema allows them, as vLLM's default backend (xgrammar, strict) does: pydantic's schemas
  # (LangChain's, instructor's) leave additionalProperties out, and SmolLM2 went on adding keys until max_tokens
  call = " | ".join(json.dumps(f'{{"name": {json.dumps(name)}, "{key}": ') + " %json " + json.dumps({"additionalProperties": False} | schema
                    | {"x-guidance": ARGUMENTS_STYLE}) + ' "}"' for name, schema in schemas.items())
  # a reasoning turn the prompt opened ends at once
  start = f'start: {tag("</think>")} "\\n\\n" ' if thinking else "start: "
  # Llama 3 templates take one call per turn
  if tool_format == "json": return f"{start}({call})"
  # one call, or several; each may end its line: the turn may end after that newline too, not only right after </tool_call>, so a model
  # that writes a newline before it ends is not made to call again
  return start + 'tool_call' + '+' * parallel + f'\ntool_call: {tag("<tool_call>")} "\\n" ({call}) "\\n" {tag("</tool_call>")} "\\n"?'

class OutputParser:
  """One choice's text, as it streams in, as OpenAI's choices with deltas of reasoning (also as reasoning_content), content and
  tool_calls. StreamRouter holds back a tail that may start a tag and keeps the text from the first <tool_call> on, parsed when the choice
  ends: markup that does not parse is content, but for a call max_tokens cut off (its tag too), which is dropped. Llama 3's JSON form is
  a whole output that parses as one call (its <|python_tag|> is a special token, so never in the text); cut off, it is dropped too."""
  def __init__(self, tool_format:str | None, reasoning:bool, thinking:bool, parallel:bool=True):
    # parallel false: the text before the first call and that call, no more (vLLM drops the later calls)
    self.router, self.tool_format, self.json, self.parallel = StreamRouter(thinking), tool_format, "" if tool_format == "json" else None, parallel
    # a template that knows no <think> leaves it to the content
    if not reasoning: self.router.mode = "content"
    self.calls, self.finish_reason, self.stop_reason, self.message = 0, None, None, {"role": "assistant", "content": ""}

  def feed(self, out) -> dict | None:
    """An engine output of this choice as its streamed choice, or None while there is nothing to say. The last one (finish_reason) sends
    what was held, and a choice that called tools ends in "tool_calls"."""
    delta, text, final = {}, out.text, out.finish_reason is not None
    # a Hermes call that max_tokens cut off is dropped, never content, as vLLM does: from its <tool_call> (no end tag), or from the start
    # of that tag, "<", "<tool", ... (issue #61). Until the output is final the router holds back what may begin a tag; cut, it never is
    cut = out.finish_reason == "length" and self.tool_format == "hermes"
    # Llama 3: an output that starts with "{" is a call, known only at its end
    if self.json is not None:
      self.json, text = self.json + text, ""
      if final or self.json.strip() and not self.json.lstrip().startswith("{"):
        if call := final and self.call(self.json): merge(delta, {"tool_calls": [call]})
        # a call max_tokens cut off is dropped, from its first token on ('{"', '{"name', ...), as a Hermes one is (issue #70)
        text, self.json = "" if call or out.finish_reason == "length" and '{"name"'.startswith(self.json[:7]) else self.json, None
    # reasoning_content is sent as reasoning too: vLLM's name (since its pull request 27752), which its clients read; DeepSeek's clients
    # read reasoning_content
    for key, value in self.router.route(text, final and not cut): merge(delta, {key: value, key.removesuffix("_content"): value})
    # what it held (no call yet), a call with no end tag, or a tag's start after calls ("<" and letters of "tool_call" in order, at the end)
    if cut: self.router.buf = re.sub(r"(?s)^(?!<tool_call>).*|<tool_call>(?!.*</tool_call>).*|<t?o?o?l?_?c?a?l?l?\Z", "", self.router.buf)
    # the calls, at the end
    for part in re.split(r"(<tool_call>.*?(?:</tool_call>|\Z))", self.router.buf if final else "", flags=re.S)[:None if self.parallel else 2]:
      call = part.startswith("<tool_call>") and self.call(part.removeprefix("<tool_call>").removesuffix("</tool_call>"))
      # markup that does not parse is content; whitespace between calls is markup
      merge(delta, {"tool_calls": [call]} if call else {"content": part} if part.strip() or not self.tool_format else {})
    merge(self.message, delta | {"tool_calls": [{k: v for k, v in c.items() if k != "index"} for c in delta.get("tool_calls", [])]})
    # a choice that called tools ends in "tool_calls"
    self.finish_reason, self.stop_reason = "tool_calls" if self.calls and out.finish_reason == "stop" else out.finish_reason, out.stop_reason
    return self.choice(delta=delta) if delta or final else None

  def choice(self, **content) -> dict:
    """The choice as OpenAI's, with vLLM's stop_reason: the stop string that ended it."""
    return {"index": 0, **content, "logprobs": None, "finish_reason": self.finish_reason, "stop_reason": self.stop_reason}

  def reply(self) -> dict:
    """The whole choice, as a non-streaming response carries it: content is null beside tool calls alone."""
    return self.choice(message=self.message | ({"content": None} if self.calls and not self.message["content"].strip() else {}))

  def call(self, text:str) -> dict | None:
    """A tool call as OpenAI's delta, or None if the text is not one."""
    if not (self.tool_format and (parsed := parse_tool_call(text)) and isinstance(parsed[0], str) and isinstance(parsed[1], dict)): return None
    self.calls += 1; return {"index": self.calls - 1, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                             "function": {"name": parsed[0], "arguments": json.dumps(parsed[1], ensure_ascii=False)}}
