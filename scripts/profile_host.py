#!/usr/bin/env python3
"""The GPU's idle share of an engine step at a large decode batch, and the host functions' time per step.

  python scripts/profile_host.py --config llama-3.2-1b --device CUDA --kv-cache-memory 40   # idle share on a GPU
  python scripts/profile_host.py --stub                                                     # host Python only (the step graphs stubbed)

--seqs sequences decode together (random 100-300 token prompts). The engine steps --steps times; then the step graph of the same batch
is launched --steps times back to back with one wait at the end, so the GPU never waits for the host: that is the step's device time.
idle share = 1 - device time / engine step time. Host functions are timed inside the engine steps (medians, ms per step); with async
scheduling most of them run while the GPU works, so they no longer add up to the idle time. Works on the engine before async scheduling
too (its ModelRunner.run), for before/after runs in one lease: the device time then comes from the after run."""
import argparse, collections, os, statistics, sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np
from tinygrad import Tensor
from tinygrad.engine.jit import _TinyJit
from scripts.bench import model_folder
from tinyvllm import LLM, SamplingParams, scheduler, model_runner, tokenizer, block_manager, llm_engine

def timed(f, key, acc):
  def w(*a, **k):
    t = time.perf_counter()
    try: return f(*a, **k)
    finally: acc[key] += time.perf_counter() - t
  return w

if __name__ == "__main__":
  p = argparse.ArgumentParser()
  p.add_argument("--config"); p.add_argument("--model"); p.add_argument("--device"); p.add_argument("--kv-cache-memory", type=float)
  p.add_argument("--seqs", type=int, default=256); p.add_argument("--steps", type=int, default=30); p.add_argument("--stub", action="store_true")
  a = p.parse_args()
  acc, rng = collections.defaultdict(float), np.random.default_rng(0)
  if a.stub:   # the step graph returns R pseudo-random tokens: the device costs nothing
    class Fake:
      def __init__(self, R): self.R = R
      def tolist(self): return rng.integers(3, 512, self.R).tolist()
      def numpy(self): return rng.integers(3, 512, self.R).astype(np.int32)   # a token per row
    # the model graph gets its sizes as keywords (a partial's before the shared step buffer), the sampler graph the model's logits
    _TinyJit.__call__ = lambda self, *args, **kw: Fake(kw.get("num_rows") or getattr(self.fxn, "keywords", {}).get("num_rows") or args[1].R)
  Tensor.tolist = timed(Tensor.tolist, "wait for the GPU (tolist)", acc)
  Tensor.numpy = timed(Tensor.numpy, "wait for the GPU (numpy)", acc)
  runner_fn = "prepare" if hasattr(model_runner.ModelRunner, "prepare") else "run"
  # the stop checks: the engine's process_output since #64, the scheduler's postprocess before it (check_stop before #55)
  stop_at = next((cls, n) for cls, n in ((llm_engine.LLMEngine, "process_output"), (scheduler.Scheduler, "postprocess"),
                                        (scheduler.Scheduler, "check_stop")) if hasattr(cls, n))
  for cls, name in [(scheduler.Scheduler, "schedule"), (model_runner.ModelRunner, runner_fn), stop_at,
                    (block_manager.BlockManager, "commit"), (_TinyJit, "__call__"),
                    *[(scheduler.Scheduler, name) for name in ("receive", "advance", "check_stop") if hasattr(scheduler.Scheduler, name)],
                    *[(model_runner.ModelRunner, name) for name in ("read", "download") if hasattr(model_runner.ModelRunner, name)]]:
    setattr(cls, name, timed(getattr(cls, name), f"{cls.__name__}.{name}", acc))
  if hasattr(tokenizer.Tokenizer, "detokenizer"):   # each sequence's detokenizer (tokenizers' DecodeStream), timed per token
    detokenizer = tokenizer.Tokenizer.detokenizer
    tokenizer.Tokenizer.detokenizer = lambda self, ids: timed(detokenizer(self, ids), "detokenize (DecodeStream.step)", acc)
  else: tokenizer.IncrementalDetokenizer.add = timed(tokenizer.IncrementalDetokenizer.add, "IncrementalDetokenizer.add", acc)
  path, load_format = model_folder(a)
  llm = LLM(path, device=a.device, load_format=load_format, max_num_seqs=a.seqs, max_num_batched_tokens=2048, kv_cache_memory=a.kv_cache_memory)
  eng = llm.engine
  vocab = min(eng.runner.hf_config["vocab_size"], 32000)
  for _ in range(a.seqs):
    eng.add_request(rng.integers(3, vocab, int(rng.integers(100, 300))).tolist(), SamplingParams(max_tokens=10**6, ignore_eos=True, temperature=0.6))
  while eng.scheduler.waiting or any(s.num_computed_tokens < s.num_prompt_tokens for s in eng.scheduler.running): eng.step()
  for _ in range(3): eng.step()
  steps = []
  for _ in range(a.steps):
    acc.clear(); t = time.perf_counter(); eng.step(); steps.append((time.perf_counter() - t, dict(acc)))
  step_ms = statistics.median(t for t, _ in steps) * 1e3
  print(f"{a.seqs} decoding sequences, {a.steps} steps{' (device stubbed)' if a.stub else ''}, {runner_fn}(): engine step median {step_ms:.2f} ms")
  for key in sorted({k for _, s in steps for k in s}):
    print(f"  {key:40s} median {statistics.median(s.get(key, 0.0) for _, s in steps) * 1e3:.3f} ms/step")
  if runner_fn == "prepare" and not a.stub:
    batch = eng.scheduler.schedule()   # one more decode step of the same sequences, launched back to back
    launch = eng.runner.prepare(batch)[0]
    launch().tolist()
    t = time.perf_counter()
    for _ in range(a.steps): out = launch()
    out.tolist()
    device_ms = (time.perf_counter() - t) / a.steps * 1e3
    print(f"device time of the step (back to back): {device_ms:.2f} ms; GPU idle share of an engine step: {1 - device_ms / step_ms:.1%}")
  for rid in list(eng.requests): eng.abort(rid)
