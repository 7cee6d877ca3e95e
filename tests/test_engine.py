"""The continuous-batching engine through the paged KV cache, against recorded transformers outputs and against itself run one request at a time."""
import json, os, shutil, pytest, numpy as np, torch, transformers
from tinyvllm import LLM, SamplingParams, Config
from tinyvllm.llm_engine import LLMEngine
from tinyvllm.config import BUNDLED_MODEL

REF = json.load(open(os.path.join(os.path.dirname(__file__), "data", "reference.json")))["cases"]
GREEDY = SamplingParams(temperature=0, max_tokens=40)

@pytest.fixture(scope="module")
def llm(): return LLM(max_num_seqs=32, max_num_batched_tokens=64)

def test_greedy_matches_transformers_reference(llm):
  outs = llm.generate([c["prompt_token_ids"] for c in REF], GREEDY, use_tqdm=False)
  for case, out in zip(REF, outs):
    assert out.outputs[0].token_ids == case["output_token_ids"]
    assert out.outputs[0].text == case["output_text_in_context"]
    assert out.outputs[0].finish_reason == ("stop" if case["stopped_at_eos"] else "length")

def test_at_ready_a_long_prompt_runs_whole_on_the_cpu_in_a_graph_captured_at_its_first_use():
  """LLMEngine alone is ready with the graphs of a decode and of a 64-token chunk (the server captures the others while idle, LLM all of
  them at once); on the CPU the prompt-sized buckets (over max_num_seqs) are in from the start, each graph captured at its first use. A
  long prompt runs in one step each time, captured then replayed, and gives transformers' greedy tokens every time."""
  engine, steps = LLMEngine(Config(max_num_seqs=32, enable_prefix_caching=False)), []
  prepare, prompt = engine.runner.prepare, (REF[0]["prompt_token_ids"] + REF[0]["output_token_ids"]) * 9   # 405 tokens
  engine.runner.prepare = lambda batch, *args: steps.append(sum(num_new for _, num_new in batch)) or prepare(batch, *args)
  assert engine.runner.buckets == [1, 64, 128, 256, 512]
  with torch.no_grad():
    hf, ids = transformers.AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float32), list(prompt)
    for _ in range(24): ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
  for _ in range(3):
    steps.clear(); engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    ours = [token for _ in iter(engine.has_unfinished, False) for out in engine.step() for token in out.outputs[0].token_ids]
    assert steps[0] == 405 and ours == ids[len(prompt):]
    assert engine.runner.graphs[("model", 512)].captured is not None   # captured at the first run, replayed at the others

def mixed_prompts(n, vocab, seed=0):   # lengths from 1 token to well past the 64-token chunk
  rng = np.random.default_rng(seed)
  return [[1] + rng.integers(3, vocab, int(rng.integers(0, 150))).tolist() for _ in range(n)]

def test_32_concurrent_equal_one_at_a_time(llm):
  prompts = mixed_prompts(32, 512)
  together = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
  alone = [llm.generate([p], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)[0] for p in prompts[:8]]
  assert [o.outputs[0].token_ids for o in together[:8]] == [o.outputs[0].token_ids for o in alone]
  assert len(llm.engine.block_manager.free) == llm.engine.block_manager.num_blocks

def test_seeds_topk_and_stop_strings(llm):
  p = [REF[0]["prompt_token_ids"]]
  a, b, c = (llm.generate(p * 2, SamplingParams(temperature=1.0, seed=s, max_tokens=30), use_tqdm=False) for s in (7, 7, 8))
  assert a[0].outputs[0].text == a[1].outputs[0].text == b[0].outputs[0].text and a[0].outputs[0].text != c[0].outputs[0].text
  topk1 = llm.generate(p, SamplingParams(temperature=0.8, top_k=1, max_tokens=40, seed=3), use_tqdm=False)[0].outputs[0]
  assert topk1.token_ids == REF[0]["output_token_ids"]
  tight = llm.generate(p, SamplingParams(temperature=0.7, top_p=1e-6, max_tokens=40), use_tqdm=False)[0].outputs[0]
  assert tight.token_ids == REF[0]["output_token_ids"]           # top_p that small keeps only the most likely token
  # min_p 1 keeps only the most likely token too, for this request only: its batch neighbour samples freely at the same seed
  only_max, free = llm.generate(p * 2, [SamplingParams(temperature=1.5, min_p=1.0, max_tokens=40, seed=3),
                                        SamplingParams(temperature=1.5, max_tokens=40, seed=3)], use_tqdm=False)
  assert only_max.outputs[0].token_ids == REF[0]["output_token_ids"] != free.outputs[0].token_ids
  full = REF[0]["output_text_in_context"]
  stop = full[20:26]
  cut = llm.generate(p, SamplingParams(temperature=0, max_tokens=40, stop=[stop, "zzzz"]), use_tqdm=False)[0].outputs[0]
  assert cut.text == full[:full.index(stop)] and cut.finish_reason == "stop"

def test_n_above_one_is_refused():
  """n > 1 went to pay for tensor parallelism: a ValueError naming n; n=1 is the default."""
  for n in (2, 8):
    with pytest.raises(ValueError, match="n must be 1") as e: SamplingParams(n=n)
    assert e.value.param == "n"
  assert SamplingParams(n=1).n == 1

def test_prefix_cache_hits_give_identical_output(llm):
  bm, prompt = llm.engine.block_manager, REF[2]["prompt_token_ids"] * 6
  first = llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
  hits = bm.hits
  again = llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
  assert bm.hits - hits >= (len(prompt) - 1) // 16 * 16 and again == first
  uncached = LLM(enable_prefix_caching=False, enforce_eager=True)
  assert uncached.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == first

def test_abort_returns_every_block(llm):
  eng = llm.engine
  rids = [eng.add_request(p, SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)) for p in mixed_prompts(8, 512, 1)]
  for _ in range(6): eng.step()
  assert len(eng.block_manager.free) < eng.block_manager.num_blocks
  for rid in rids: eng.abort(rid)
  assert not eng.has_unfinished() and len(eng.block_manager.free) == eng.block_manager.num_blocks

def test_bad_requests_raise_clearly_and_leak_nothing(llm):
  eng, ok = llm.engine, SamplingParams(temperature=0, max_tokens=4)
  eng.add_request([1, 2, 3], ok, "dup")
  for prompt, params, rid, msg in [([], ok, None, "between 1 and"), ([1] * 600, ok, None, "max_model_len"), ([1, 512], ok, None, r"\[0, 512\)"),
                                   ([1, 2], ok, "dup", "already running")]:
    with pytest.raises(ValueError, match=msg): eng.add_request(prompt, params, rid)
  for bad in [dict(temperature=-1), dict(top_p=0), dict(max_tokens=0), dict(n=0), dict(top_k=-2), dict(stop=[""])]:
    with pytest.raises(ValueError): SamplingParams(**bad)
  while eng.has_unfinished(): eng.step()
  assert len(eng.block_manager.free) == eng.block_manager.num_blocks

@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):   # a random fp32 Llama with stories260K's tokenizer, saved by transformers
  path = tmp_path_factory.mktemp("tiny_llama")
  torch.manual_seed(0)
  cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=1, max_position_embeddings=512, architectures=["LlamaForCausalLM"])
  transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
  for name in ("tokenizer.json", "tokenizer_config.json"): shutil.copy(os.path.join(BUNDLED_MODEL, name), path)
  return str(path)

def test_preemption_with_tiny_pool_keeps_outputs(tiny_llama):
  prompts, params = mixed_prompts(32, 512, 2), SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
  roomy = LLM(tiny_llama, max_num_seqs=32, max_num_batched_tokens=64)
  tight = LLM(tiny_llama, max_num_seqs=32, max_num_batched_tokens=64, kv_cache_memory=40.5 * 4096 / 1e9)   # 40 blocks of 2 layers x K,V x 16 slots x 1 head x 16 dims x fp32
  assert tight.engine.block_manager.num_blocks == 40
  alone = [roomy.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts[:6]]
  together = [o.outputs[0].token_ids for o in tight.generate(prompts, params, use_tqdm=False)]
  assert together[:6] == alone and tight.engine.scheduler.num_preemptions > 0
  assert together == [o.outputs[0].token_ids for o in roomy.generate(prompts, params, use_tqdm=False)]
  assert len(tight.engine.block_manager.free) == tight.engine.block_manager.num_blocks

def test_a_kv_pool_full_of_garbage_changes_no_output():
  """The KV pool is allocated without zeroing: attention must read only slots its tokens wrote. Every slot is filled with NaN before the
  requests (batched, prompts chunked into 16-token steps), and the greedy outputs are still transformers'."""
  llm = LLM(max_num_seqs=8, max_num_batched_tokens=16)
  for pool in (pool for layer in llm.engine.runner.kv for pool in layer): pool.assign(pool.full_like(float("nan"))).realize()
  assert np.isnan(llm.engine.runner.kv[0][0].numpy()).all()
  outs = llm.generate([c["prompt_token_ids"] for c in REF], GREEDY, use_tqdm=False)
  assert [out.outputs[0].token_ids for out in outs] == [case["output_token_ids"] for case in REF]
