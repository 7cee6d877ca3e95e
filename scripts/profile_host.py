#!/usr/bin/env python3
"""Host-side (Python) time per engine step at a large decode batch: the time the GPU would sit idle between two steps.

  python scripts/profile_host.py                  # bundled model on the default device; device time = the TinyJit call + the .tolist() sync
  python scripts/profile_host.py --stub           # no device work at all: the step graph returns random tokens, only host Python is left
Prints ms per step (whole step, device part, host part) for --seqs sequences decoding together, and the main host functions' share."""
import argparse, collections, os, statistics, sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np
from tinygrad import Tensor
from tinygrad.engine.jit import _TinyJit
from tinyvllm import LLM, SamplingParams, llm_engine, scheduler, model_runner, tokenizer, block_manager   # noqa: F401

def timed(f, key, acc):
  def w(*a, **k):
    t = time.perf_counter()
    try: return f(*a, **k)
    finally: acc[key] += time.perf_counter() - t
  return w

if __name__ == "__main__":
  p = argparse.ArgumentParser()
  p.add_argument("--seqs", type=int, default=256); p.add_argument("--steps", type=int, default=30); p.add_argument("--stub", action="store_true")
  a = p.parse_args()
  acc, rng = collections.defaultdict(float), np.random.default_rng(0)
  if a.stub:   # the step graph returns R pseudo-random tokens: the device costs nothing
    class Fake:
      def __init__(self, R): self.R = R
      def tolist(self): return rng.integers(3, 512, self.R).tolist()
    _TinyJit.__call__ = lambda self, *args: Fake(self.fxn.keywords["num_rows"])
  _TinyJit.__call__, Tensor.tolist = timed(_TinyJit.__call__, "device", acc), timed(Tensor.tolist, "device", acc)
  for cls, name in [(scheduler.Scheduler, "schedule"), (model_runner.ModelRunner, "run"), (scheduler.Scheduler, "check_stop"),
                    (tokenizer.IncrementalDetokenizer, "add"), (block_manager.BlockManager, "commit")]:
    setattr(cls, name, timed(getattr(cls, name), f"{cls.__name__}.{name}", acc))
  eng = LLM(max_num_seqs=a.seqs, max_num_batched_tokens=2048).engine
  for _ in range(a.seqs):
    eng.add_request(rng.integers(3, 512, int(rng.integers(100, 300))).tolist(), SamplingParams(max_tokens=10**6, ignore_eos=True, temperature=0.6))
  while eng.scheduler.waiting or any(s.num_computed_tokens < s.num_prompt_tokens for s in eng.scheduler.running): eng.step()
  steps = []
  for _ in range(a.steps):
    acc.clear(); t = time.perf_counter(); eng.step(); steps.append((time.perf_counter() - t, dict(acc)))
  med = lambda key: statistics.median(s[1].get(key, 0.0) for s in steps) * 1e3
  host = sorted((t - s.get("device", 0.0)) * 1e3 for t, s in steps)
  print(f"{a.seqs} decoding sequences, {a.steps} steps{' (device stubbed)' if a.stub else ''}: step median {statistics.median(t for t, _ in steps)*1e3:.2f} ms,"
        f" device {med('device'):.2f} ms, host min {host[0]:.2f} / median {statistics.median(host):.2f} ms")
  for key in sorted(k for k in acc if k != "device"): print(f"  {key:34s} median {med(key):.3f} ms/step")   # ModelRunner.run includes the device
