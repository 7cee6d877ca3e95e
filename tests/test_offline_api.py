"""The offline API behaves like vLLM's `LLM`: prompt forms, chat, validation before queueing, stop reasons, errors that leave the engine
clean. References are the recorded transformers outputs (tests/data/reference.json) and the engine's own plain-token-id path."""
import gc, json, os, random, time, weakref, numpy as np, pytest, torch, transformers
from tinyvllm import LLM, SamplingParams, Config
from tinyvllm.config import BUNDLED_MODEL
from tinyvllm.llm_engine import LLMEngine, EngineError
from tinyvllm.sequence import ParamError, MAX_STOP_STRINGS

REF = json.load(open(os.path.join(os.path.dirname(__file__), "data", "reference.json")))["cases"]
GREEDY = SamplingParams(temperature=0, max_tokens=40)

@pytest.fixture(scope="module")
def llm(): return LLM(max_num_seqs=8, max_num_batched_tokens=64)

def texts(outs): return [o.outputs[0].text for o in outs]

def all_blocks_free(llm): return len(llm.engine.block_manager.free) == llm.engine.block_manager.num_blocks

def test_prompt_forms_match_the_recorded_reference(llm):
  case = REF[0]
  forms = [case["prompt"], {"prompt": case["prompt"]}, {"prompt_token_ids": case["prompt_token_ids"]}, case["prompt_token_ids"]]
  assert case["prompt_token_ids"] == llm.engine.tokenizer.encode(case["prompt"])
  for form in forms:
    out = llm.generate(form, GREEDY, use_tqdm=False)
    assert len(out) == 1 and out[0].outputs[0].token_ids == case["output_token_ids"] and out[0].prompt_token_ids == case["prompt_token_ids"]
  assert texts(llm.generate(forms, GREEDY, use_tqdm=False)) == [case["output_text_in_context"]] * 4

def test_a_bad_prompt_queues_nothing(llm):
  ok, too_long = REF[1]["prompt"], [1] * 600
  for bad in ([ok, too_long], [ok, {"text": ok}], [ok, [1, 10**6]], [ok, 3.5]):
    with pytest.raises(ValueError): llm.generate(bad, GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished() and all_blocks_free(llm)
  with pytest.raises(ValueError, match="2 prompts but 1 sampling params"): llm.generate([ok, ok], [GREEDY], use_tqdm=False)
  assert llm.generate([ok], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == REF[1]["output_token_ids"]   # the engine still works

def test_a_bad_grammar_queues_nothing(llm):
  """Grammars are checked with the prompts, before anything is queued: the good request of a call whose second grammar does not compile
  stayed queued, and the next call raised KeyError on its id."""
  params = [GREEDY, SamplingParams(structured_outputs={"regex": "(?=a)"})]
  with pytest.raises(ValueError, match="structured_outputs"): llm.generate(["Once upon", "a time"], params, use_tqdm=False)
  assert not llm.engine.has_unfinished() and all_blocks_free(llm)
  assert texts(llm.generate([REF[0]["prompt"]], GREEDY, use_tqdm=False)) == [REF[0]["output_text_in_context"]]

def test_chat_renders_conversations_through_the_template(llm):
  conversations = [[{"role": "user", "content": "Once upon a time"}], [{"role": "user", "content": "Lily"}]]
  outs = llm.chat(conversations, GREEDY, use_tqdm=False)
  for conversation, out in zip(conversations, outs):
    assert out.prompt_token_ids == llm.engine.tokenizer.encode_chat(conversation)
    assert out.outputs[0].text == llm.generate({"prompt_token_ids": out.prompt_token_ids}, GREEDY, use_tqdm=False)[0].outputs[0].text
  assert texts(llm.chat(conversations[0], GREEDY, use_tqdm=False)) == texts(outs[:1])   # one conversation alone

def test_stop_reason(llm):
  case = REF[0]
  full, ids = case["output_text_in_context"], case["output_token_ids"]
  stop = full[20:26]
  cut = llm.generate(case["prompt"], SamplingParams(temperature=0, max_tokens=40, stop=["zzzz", stop]), use_tqdm=False)[0].outputs[0]
  assert (cut.text, cut.finish_reason, cut.stop_reason) == (full[:full.index(stop)], "stop", stop)
  length = llm.generate(case["prompt"], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0].outputs[0]
  assert (length.finish_reason, length.stop_reason) == ("length", None)

@pytest.mark.parametrize("field,value", [("temperature", 10**309), ("temperature", float("nan")), ("top_p", float("inf")), ("top_p", 0),
                                         ("top_p", 1.5), ("temperature", -0.1), ("top_k", -2), ("top_k", 2.5), ("n", 0), ("n", True),
                                         ("max_tokens", 0), ("max_tokens", "10"), ("seed", 2**63), ("seed", -2**63 - 1),
                                         ("stop", [""]), ("stop", ["x" * 257]), ("stop", ["a"] * (MAX_STOP_STRINGS + 1))])
def test_sampling_params_name_the_bad_field(field, value):
  with pytest.raises(ParamError) as e: SamplingParams(**{field: value})
  assert e.value.param == field and str(e.value).startswith(field) and "SamplingParams(" not in str(e.value)

def test_extreme_valid_params_are_accepted():
  for kw in [dict(seed=2**63 - 1), dict(seed=-2**63), dict(temperature=1e300), dict(top_k=0), dict(stop=["x" * 256] * MAX_STOP_STRINGS)]:
    SamplingParams(**kw)

def test_first_sampler_variants_capture_no_graph(llm):
  """top-k, top-p and seeds run in the graphs captured before the first batch (a greedy one here: on the CPU LLM() leaves the graphs that
  one prompt at a time never needs for the first batch of several): a request using them first costs no capture or compile."""
  llm.generate([REF[2]["prompt"]] * 3, GREEDY, use_tqdm=False)
  assert not llm.engine.runner.pending
  graphs = dict(llm.engine.runner.graphs)
  start = time.perf_counter()
  for params in [SamplingParams(temperature=0.8, top_p=0.5, max_tokens=8), SamplingParams(top_k=3, seed=5, max_tokens=8)]:
    llm.generate([REF[2]["prompt"]] * 3, params, use_tqdm=False)
  assert llm.engine.runner.graphs == graphs and time.perf_counter() - start < 5

def test_a_dropped_llm_is_collected_with_its_graphs_and_kv_pool():
  """Offline engines are not frozen out of the garbage collector (only the server's, which lives as long as its process, is)."""
  llm = LLM(max_num_seqs=8, max_num_batched_tokens=64)   # the fixture's shapes: its graphs come from the caches
  runner = weakref.ref(llm.engine.runner)
  del llm
  gc.collect()
  assert runner() is None

def test_engine_leaves_global_random_and_the_callers_config_alone():
  config = Config(max_num_seqs=4, enforce_eager=True)
  random.seed(123)
  expected = random.random()
  random.seed(123)
  engine = LLMEngine(config)
  assert random.random() == expected and config.max_model_len is None and engine.config.max_model_len == 512

def test_bad_engine_arguments_are_clear():
  with pytest.raises(ValueError, match="kv_cache_memory must be positive"): LLM(kv_cache_memory=0)
  with pytest.raises(ValueError, match="max_num_seqs must be positive"): LLM(max_num_seqs=0)
  try: LLM(dtype="bfloat16", enforce_eager=True)   # the CPU's compiler may or may not build bf16: either it works or one clear sentence
  except ValueError as e: assert str(e).startswith("dtype bfloat16 fails on CPU (") and "try dtype='float32'" in str(e)

def test_hub_id_that_cannot_be_fetched_fails_in_one_sentence(monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  with pytest.raises(ValueError, match=r"^model 'no-such-org/no-such-model' is not a local folder and could not be fetched"):
    LLM("no-such-org/no-such-model")

def test_a_failing_step_fails_only_its_requests(llm, monkeypatch):
  """Fault injection on the real engine: the step holding the marked prompt raises; a request outside that step carries on."""
  engine, marked = llm.engine, REF[2]["prompt_token_ids"]
  run = engine.runner.prepare
  def faulty(batch, *args):
    if any(seq.prompt_token_ids[:len(marked)] == marked for seq, _ in batch): raise RuntimeError("injected fault")
    return run(batch, *args)
  alone = llm.generate(REF[1]["prompt"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
  monkeypatch.setattr(engine.runner, "prepare", faulty)
  survivor = engine.add_request(REF[1]["prompt"], GREEDY)
  for _ in range(3): engine.step()                      # the survivor's prompt is in the cache and it is decoding
  victim = engine.add_request(marked, GREEDY)
  with pytest.raises(EngineError) as e:
    while True: engine.step()
  assert set(e.value.request_ids) == {survivor, victim} and not engine.has_unfinished() and all_blocks_free(llm)
  victim = engine.add_request(marked * 13, GREEDY)   # 65 tokens: its prompt fills the step (64 tokens), the next one waits
  waiting = engine.add_request(REF[1]["prompt"], GREEDY)
  with pytest.raises(EngineError) as e: engine.step()
  assert e.value.request_ids == [victim]
  out = []
  while engine.has_unfinished(): out += engine.step()
  assert {o.request_id for o in out} == {waiting} and [t for o in out for t in o.outputs[0].token_ids] == alone and all_blocks_free(llm)

def test_logprobs_are_refused():
  """logprobs went to pay for tensor parallelism: any value but None is a ValueError naming it, before anything is queued."""
  for k in (0, 5, 20):
    with pytest.raises(ValueError, match="logprobs") as e: SamplingParams(logprobs=k)
    assert e.value.param == "logprobs"
