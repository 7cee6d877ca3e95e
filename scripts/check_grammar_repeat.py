#!/usr/bin/env python3
"""Is a seeded grammar request repeatable on one engine? The bundled model's four check_tp.py prompts under a regex, at temperature 0.6
with a seed, three times on each engine (fresh, or after check_tp.py's other requests), compared with a fresh engine's first run; the
engines differ in the async path (runner.overlap: CUDA reads the tokens into page-locked memory and runs ahead; off: read, then
launch), prefix caching, and tensor_parallel_size. On an H100 (BENCHMARKS.md, "GPU after the CPU path and #64") only the engines without
prefix caching repeated exactly.

  DEV=CUDA python scripts/check_grammar_repeat.py                                # one GPU
  DEV=CUDA python scripts/check_grammar_repeat.py --tensor-parallel-size 1 2     # and two
"""
import argparse, json, os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tinyvllm import LLM, SamplingParams

if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--device", default="CUDA")
  p.add_argument("--tensor-parallel-size", type=int, nargs="+", default=[1])
  args = p.parse_args()
  ref = json.load(open(os.path.join(os.path.dirname(__file__), "..", "tests", "data", "reference.json")))["cases"]
  prompts = [c["prompt_token_ids"] for c in ref[:3]] + [ref[0]["prompt_token_ids"] * 40]
  history = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=24),
             SamplingParams(temperature=0.6, seed=7, max_tokens=24, ignore_eos=True)]
  grammar, first = SamplingParams(temperature=0.6, seed=9, max_tokens=24, structured_outputs={"regex": "[a-z ]+ [0-9]+"}), None
  for tp in args.tensor_parallel_size:
    for overlap, prefix_caching, hist in ((True, True, False), (False, True, False), (True, False, False), (False, True, True), (True, False, True)):
      llm = LLM(device=args.device, tensor_parallel_size=tp, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=1024,
                enable_prefix_caching=prefix_caching)
      llm.engine.runner.overlap = llm.engine.runner.overlap and overlap   # only CUDA has the async path's read
      for sp in history if hist else []: llm.generate(prompts, sp, use_tqdm=False)
      runs = [[o.outputs[0].token_ids for o in llm.generate(prompts, grammar, use_tqdm=False)] for _ in range(3)]
      first = first or runs[0]
      print(f"tp {tp} async {llm.engine.runner.overlap} prefix_caching {prefix_caching} after other requests {hist}: "
            f"equal to the first fresh run {[r == first for r in runs]}", flush=True)
      del llm
