"""Structured outputs through llguidance grammars, on a random-weight Llama with Llama 3's 128k vocabulary: whatever the random logits
prefer, every finished output parses and validates (jsonschema is the independent judge); rows without a grammar sample as before."""
import json, jsonschema, pytest, llguidance
import tinyvllm.llm_engine, tinyvllm.tokenizer
from tinyvllm import LLM, SamplingParams
from tinyvllm.sequence import ParamError
# imported before `counting` patches LLMatcher: serve.py's annotations name it when the module loads (imported inside a test, as it was,
# this failed whenever no earlier test file had imported serve, as when this file runs alone)
from tinyvllm.serve import build_app

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "pet", "address"], "properties": {
  "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
  "pet": {"enum": ["cat", "dog", "none"]}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
  "address": {"type": "object", "additionalProperties": False, "required": ["city"],
              "properties": {"city": {"type": "string", "maxLength": 10}, "zip": {"type": "integer", "minimum": 0, "maximum": 99999}}}}}

@pytest.fixture(scope="module")
def llm(llama3_random):   # a random Llama of Llama 3's vocabulary and tokenizer.json (conftest.py)
  return LLM(str(llama3_random), max_num_seqs=64, max_num_batched_tokens=64, max_model_len=1024)

class CountingMatcher:
  """llguidance's LLMatcher as tinyvllm's modules see it, counting each compile of a grammar against the tokenizer: a matcher made, or
  validate_grammar (which compiles it too, and throws the result away)."""
  def __init__(self): self.compiles = 0
  def __call__(self, *args, **kwargs):
    self.compiles += 1
    return llguidance.LLMatcher(*args, **kwargs)
  def validate_grammar(self, *args, **kwargs):
    self.compiles += 1
    return llguidance.LLMatcher.validate_grammar(*args, **kwargs)
  def __getattr__(self, name): return getattr(llguidance.LLMatcher, name)   # grammar_from_json_schema, ...

@pytest.fixture
def counting(monkeypatch):
  counter = CountingMatcher()
  for module in (tinyvllm.tokenizer, tinyvllm.llm_engine): monkeypatch.setattr(module, "LLMatcher", counter)
  return counter

def test_grammar_compiled_once_per_request_offline(llm, counting):
  """Each structured request's grammar is compiled once (issue #55): LLM.generate checks every request before it queues any, and the
  matcher that check compiled is the one the sequence follows. A bad grammar is one compile too, and queues nothing."""
  outs = llm.generate(["A person as JSON."] * 3, SamplingParams(max_tokens=64, structured_outputs={"json": SCHEMA}), use_tqdm=False)
  assert len(outs) == 3 and counting.compiles == 3
  with pytest.raises(ParamError, match="Invalid type"):
    llm.generate(["x", "y"], [SamplingParams(structured_outputs={"regex": "[ab]+"}), SamplingParams(structured_outputs={"json": {"type": "strin"}})],
                 use_tqdm=False)
  assert counting.compiles == 5 and not llm.engine.has_unfinished()
  assert llm.generate("x", SamplingParams(max_tokens=4), use_tqdm=False)[0].outputs[0].token_ids and counting.compiles == 5

def test_json_schema_outputs_always_validate(llm):
  params = SamplingParams(temperature=1.0, max_tokens=400, structured_outputs={"json": SCHEMA})
  outs = llm.generate(["Tell me about a person as JSON."] * 50, params, use_tqdm=False)
  assert len({o.outputs[0].text for o in outs}) > 40   # random weights at T=1: genuinely different documents
  for out in outs:
    assert out.outputs[0].finish_reason == "stop", out.outputs[0].text
    jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)

def test_choice_regex_and_json_object(llm):
  choice = llm.generate(["Pick"] * 8, SamplingParams(seed=2, structured_outputs={"choice": ["yes", "no way", 'say "hi"']}), use_tqdm=False)
  assert all(o.outputs[0].text in ("yes", "no way", 'say "hi"') for o in choice)
  regex = llm.generate(["Date"] * 8, SamplingParams(seed=3, max_tokens=30, structured_outputs={"regex": r"20[0-9]{2}-(0[1-9]|1[0-2])"}),
                       use_tqdm=False)
  assert all(len(o.outputs[0].text) == 7 and o.outputs[0].text[:2] == "20" and o.outputs[0].text[4] == "-" for o in regex)
  obj = llm.generate("JSON", SamplingParams(temperature=0, max_tokens=500, structured_outputs={"json_object": True}), use_tqdm=False)[0]
  assert obj.outputs[0].text.startswith("{")   # greedy on random weights: it may not close within max_tokens, but it is JSON so far

def test_rows_without_a_grammar_are_unchanged(llm):
  plain = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
  alone = llm.generate(["Once upon a time"], plain, use_tqdm=False)[0].outputs[0].token_ids
  mixed = llm.generate(["Once upon a time", "x"], [plain, SamplingParams(structured_outputs={"json": SCHEMA})], use_tqdm=False)
  assert mixed[0].outputs[0].token_ids == alone

@pytest.mark.parametrize("spec,message", [({"json": {"type": "strin"}}, "Invalid type"), ({"json": {"not": {}}}, "Unimplemented keys"),
                                          ({"regex": "(?=a)"}, "look-around"), ({"xml": "<a/>"}, "takes one of"), ("json", "takes one of")])
def test_bad_grammars_are_refused_by_name(llm, spec, message):
  with pytest.raises(ParamError, match=message) as e: llm.generate("x", SamplingParams(structured_outputs=spec), use_tqdm=False)
  assert e.value.param == "structured_outputs" and not llm.engine.has_unfinished()

def test_bundled_vocabulary_takes_grammars():   # stories260K's tokenizer.json, made from sentencepiece ("▁" pieces, byte fallback)
  # test_offline_api's engine shapes, in graphs: its kernels come from cache.db, and a step is ~20 ms. Eager steps (0.3-0.7 s each, and a
  # compile for every new batch size as rows finish) made this test 90 s on 2 cores; eager grammars run in test_chat's DeepSeek-R1 server
  llm = LLM(max_num_seqs=8, max_num_batched_tokens=64)
  outs = llm.generate(["Pick"] * 8, SamplingParams(seed=1, structured_outputs={"choice": ["yes", "no way"]}), use_tqdm=False)
  assert all(o.outputs[0].text in ("yes", "no way") for o in outs)
  # JSON too: compact separators need no lone space token, which this vocabulary cannot end a piece with (": " then stopped early)
  schema = {k: v for k, v in SCHEMA.items() if k != "required"} | {"required": ["name", "age", "tags"]}
  params = [SamplingParams(temperature=1.0, max_tokens=200, seed=i, structured_outputs={"json": schema}) for i in range(16)]
  for out in llm.generate(["Once upon a time"] * 16, params, use_tqdm=False):
    jsonschema.validate(json.loads(out.outputs[0].text), schema)

def test_response_format_through_the_openai_client(llm, counting):
  """The official client against a live server on this vocabulary: json_schema output validates, json_object output is JSON, and a
  schema llguidance rejects is a 400 naming response_format. Each one's grammar is compiled once: chat.py's matcher is the engine's."""
  import asyncio, threading, time, openai, uvicorn
  from tinyvllm.llm_engine import AsyncLLM
  # the module engine's config: every kernel is in tinygrad's caches already, so its graphs capture in seconds (eager, the two 300-token
  # answers took a minute on 2 cores). Every graph in before serving: no capture left running when the test ends
  engine = AsyncLLM(llm.engine.config)
  while engine.engine.runner.pending: time.sleep(0.05)
  server = uvicorn.Server(uvicorn.Config(build_app(engine, "tiny"), host="127.0.0.1", port=0, log_level="warning"))
  thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
  thread.start()
  while not server.started: thread.join(0.05)
  port = server.servers[0].sockets[0].getsockname()[1]
  client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=300, max_retries=0)
  try:
    messages = [{"role": "user", "content": "A person as JSON"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    r = client.chat.completions.create(model="tiny", messages=messages, response_format=fmt, max_tokens=300, seed=4)
    assert r.choices[0].finish_reason == "stop" and counting.compiles == 1
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    stream = client.chat.completions.create(model="tiny", messages=messages, response_format=fmt, max_tokens=300, seed=5, stream=True)
    jsonschema.validate(json.loads("".join(c.choices[0].delta.content or "" for c in stream if c.choices)), SCHEMA)
    assert counting.compiles == 2
    r = client.chat.completions.create(model="tiny", messages=messages, response_format={"type": "json_object"}, max_tokens=8)
    assert r.choices[0].message.content.startswith("{") and counting.compiles == 3
    with pytest.raises(openai.BadRequestError, match="Invalid type") as e:
      client.chat.completions.create(model="tiny", messages=messages, response_format={"type": "json_schema", "json_schema": {
        "name": "bad", "schema": {"type": "strin"}}})
    assert e.value.body["param"] == "response_format" and counting.compiles == 4
    # the refused request left the engine as it was: the next one is served
    r = client.chat.completions.create(model="tiny", messages=messages, response_format={"type": "json_object"}, max_tokens=8)
    assert r.choices[0].message.content.startswith("{") and counting.compiles == 5
  finally:
    server.should_exit = True
    thread.join(10)
