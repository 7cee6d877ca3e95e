"""Issue #62's correctness check on a real accelerator (the CPU never runs ahead): the bundled model through the engine with async
scheduling, greedy against transformers' recorded outputs (tests/data/reference.json), and seeded / top-p outputs and a full batch whose
requests end by EOS, stop string or max_tokens, printed as JSON so that two trees (this one and a baseline) can be compared token for
token. Also: an abort in flight and a preemption leak no block.
  python scripts/check_async.py --device CUDA > ours.json; PYTHONPATH=<baseline tree> python scripts/check_async.py --device CUDA > base.json"""
import argparse, json, os, sys
sys.path.insert(0, os.environ.get("TREE", "."))
from tinyvllm import LLM, SamplingParams

p = argparse.ArgumentParser(); p.add_argument("--device", default="CUDA"); p.add_argument("--eager", action="store_true"); args = p.parse_args()
REF = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "reference.json")))["cases"]
out = {}
for eager in ([True, False] if args.eager else [False]):
  llm = LLM(device=args.device, enforce_eager=eager, max_num_seqs=16, kv_cache_memory=0.001)   # 48 blocks: preemptions
  greedy = llm.generate([c["prompt_token_ids"] for c in REF], SamplingParams(temperature=0, max_tokens=40), use_tqdm=False)
  ok = [r.outputs[0].token_ids[:len(c["output_token_ids"])] == c["output_token_ids"] for r, c in zip(greedy, REF)]
  print(f"eager={eager} greedy == transformers' reference: {ok}", file=sys.stderr)
  prompts = [c["prompt_token_ids"] for c in REF] * 6   # 18 requests, a full batch of 16 and 2 waiting
  # mixed endings in one batch: max_tokens 1..18, a stop string, seeded top-p, EOS allowed
  params = [SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=1 + i, stop=["Lily"] if i % 3 == 0 else None) for i in range(18)]
  mixed = llm.generate(prompts, params, use_tqdm=False)
  seeded = llm.generate(prompts[:3], SamplingParams(temperature=1.0, seed=7, max_tokens=60), use_tqdm=False)
  out[f"eager={eager}"] = {"greedy_ok": ok, "mixed": [(r.outputs[0].token_ids, r.outputs[0].text, r.outputs[0].finish_reason) for r in mixed],
                           "seeded": [r.outputs[0].token_ids for r in seeded]}
  bm = llm.engine.block_manager
  assert len(bm.free) == bm.num_blocks, (len(bm.free), bm.num_blocks)
  # an abort while its step is in flight, and preemption (a tiny pool), leak nothing
  eng = llm.engine
  rids = [eng.add_request(c["prompt_token_ids"], SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)) for c in REF * 4]
  for _ in range(5): eng.step()
  for rid in rids: eng.abort(rid)
  while eng.has_unfinished(): eng.step()
  eng.step()
  print(f"eager={eager} blocks after abort: {len(bm.free)} / {bm.num_blocks} free; preemptions so far {eng.scheduler.num_preemptions}", file=sys.stderr)
  out[f"eager={eager}"]["leak_free"] = len(bm.free) == bm.num_blocks
print(json.dumps(out))
