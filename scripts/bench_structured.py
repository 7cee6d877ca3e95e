#!/usr/bin/env python3
"""Per-token cost of structured outputs (llguidance grammar masks) at a fixed batch: decode steps of B sequences held inside a JSON string
(so every step fills and applies a real mask), against the same B sequences without a grammar. Prints ms per step and per token.

  python scripts/bench_structured.py --config llama-3.2-1b --device CUDA --batch 1 64
"""
import argparse, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from scripts.bench import model_folder   # same dummy-config + Llama 3 tokenizer resolution as the benchmark
from tinyvllm import LLM, SamplingParams

def per_step(llm, batch:int, steps:int, grammar:dict|None) -> float:
  """Seconds per decode step of `batch` sequences, prefill excluded."""
  eng = llm.engine
  params = SamplingParams(temperature=1.0, max_tokens=steps + 8, ignore_eos=grammar is None, structured_outputs=grammar)
  for i in range(batch): eng.add_request([1 + (i * 7 + j) % 5000 for j in range(64)], params)
  while any(s.num_computed_tokens < s.num_prompt_tokens for s in eng.scheduler.running + list(eng.scheduler.waiting)): eng.step()
  for _ in range(4): eng.step()   # past the grammar's first forced tokens ('{"text": "')
  start = time.perf_counter()
  for _ in range(steps): eng.step()
  elapsed = (time.perf_counter() - start) / steps
  for rid in list(eng.requests): eng.abort(rid)
  return elapsed

if __name__ == "__main__":
  p = argparse.ArgumentParser()
  p.add_argument("--config"); p.add_argument("--model"); p.add_argument("--device")
  p.add_argument("--batch", type=int, nargs="+", default=[1, 64]); p.add_argument("--steps", type=int, default=64)
  p.add_argument("--kv-cache-memory", type=float, default=None)
  a = p.parse_args()
  path, load_format = model_folder(a)
  llm = LLM(path, device=a.device, load_format=load_format, max_num_seqs=max(a.batch), max_num_batched_tokens=2048,
            max_model_len=1024, kv_cache_memory=a.kv_cache_memory)
  # a long string keeps random-weight sampling inside the JSON grammar (it cannot close early), so every step pays a full mask
  grammar = {"json": {"type": "object", "properties": {"text": {"type": "string", "minLength": 4000}}, "required": ["text"]}}
  print("| batch | no grammar ms/step | grammar ms/step | extra ms/step | extra ms/token |\n|---|---|---|---|---|")
  for batch in a.batch:
    for _ in range(2): plain, masked = per_step(llm, batch, a.steps, None), per_step(llm, batch, a.steps, grammar)   # 2nd round counts
    print(f"| {batch} | {plain*1e3:.2f} | {masked*1e3:.2f} | {(masked - plain)*1e3:.2f} | {(masked - plain)*1e3 / batch:.3f} |", flush=True)
