#!/usr/bin/env python3
"""Is a seeded grammar request repeatable? The bundled model's four check_tp.py prompts under a regex, at temperature 0.6 with a seed, on a
fresh engine and on one that ran other requests first, each twice, at tensor_parallel_size 1 and 2; every run is compared with the fresh
N=1 engine's first. Found on 2x H200 (BENCHMARKS.md, "GPU after the CPU path and #64"): N=1 (async scheduling, one CUDA GPU) did not
repeat itself; N=2 (the old order) did.

  DEV=CUDA python scripts/check_grammar_repeat.py        # two GPUs
"""
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tinyvllm import LLM, SamplingParams
ref = json.load(open(os.path.join(os.path.dirname(__file__), "..", "tests", "data", "reference.json")))["cases"]
prompts = [c["prompt_token_ids"] for c in ref[:3]] + [ref[0]["prompt_token_ids"] * 40]
params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=24),
          SamplingParams(temperature=0.6, seed=7, max_tokens=24, ignore_eos=True)]
g = SamplingParams(temperature=0.6, seed=9, max_tokens=24, structured_outputs={"regex": "[a-z ]+ [0-9]+"})
res = {}
for tp in (1, 2):
  for hist in (True, False):
    llm = LLM(device="CUDA", tensor_parallel_size=tp, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=1024)
    if hist:
      for sp in params: llm.generate(prompts, sp, use_tqdm=False)
    res[tp, hist] = [o.outputs[0].token_ids for o in llm.generate(prompts, g, use_tqdm=False)]
    again = [o.outputs[0].token_ids for o in llm.generate(prompts, g, use_tqdm=False)]
    print(f"tp{tp} hist={hist}: a second grammar run equal to the first: {again == res[tp, hist]}", flush=True)
    del llm
for k, v in res.items():
  print(k, ["same" if a == b else f"differs at {next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), 'len')}" for a, b in zip(v, res[1, False])], flush=True)
