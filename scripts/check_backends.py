#!/usr/bin/env python3
"""Greedy tokens of one engine on one tinygrad backend, as a JSON line, to compare backends (issue #69): the bundled model against the
transformers reference recorded in tests/data/reference.json, or a scripts/configs shape with dummy weights (the same on every backend:
tinygrad's random numbers are computed by kernels from a seed) on a fixed prompt.

  python scripts/check_backends.py --device CUDA                                  # bundled model, its reference case
  python scripts/check_backends.py --device CL --config llama-3.2-1b --dtype float16 --tokens 32
On NVIDIA's OpenCL (the GPU machine lists pocl first): mkdir -p icd && echo libnvidia-opencl.so.1 > icd/nvidia.icd && export OCL_ICD_VENDORS=$PWD/icd"""
import argparse, json, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__":
  p = argparse.ArgumentParser()
  p.add_argument("--device"); p.add_argument("--config"); p.add_argument("--dtype", default="auto"); p.add_argument("--tokens", type=int, default=32)
  p.add_argument("--enforce-eager", action="store_true")
  a = p.parse_args()
  from tinyvllm import LLM, SamplingParams
  t = time.perf_counter()
  if a.config:
    from scripts.bench import model_folder
    a.model, a.max_model_len = None, 2048
    path, load_format = model_folder(a)
    llm = LLM(path, device=a.device, dtype=a.dtype, load_format=load_format, max_num_seqs=4, max_model_len=2048, kv_cache_memory=2,
              enforce_eager=a.enforce_eager)
    prompt, expected = [128000] + [(i * 7919) % 120000 + 1000 for i in range(1030)], None   # past DENSE_MIN: the dense in-step attention runs
  else:
    case = json.load(open(os.path.join(os.path.dirname(__file__), "..", "tests", "data", "reference.json")))["cases"][0]
    llm = LLM(device=a.device, dtype=a.dtype, enforce_eager=a.enforce_eager)
    prompt, expected, a.tokens = case["prompt_token_ids"], case["output_token_ids"], case["num_new_tokens"]
  ready = time.perf_counter() - t
  out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True), use_tqdm=False)[0].outputs[0]
  print(json.dumps({"device": a.device, "config": a.config or "stories260K", "dtype": str(llm.engine.runner.dtype), "ready_s": round(ready, 1),
                    "tokens": out.token_ids, "matches_reference": None if expected is None else out.token_ids == expected}), flush=True)
