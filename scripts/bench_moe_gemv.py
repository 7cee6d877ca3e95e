#!/usr/bin/env python3
"""Checks and times the MoE decode path of tinyvllm/gemm.py: the GEMV with an expert id per row (gemm.matmul(x, w, experts=ids)), which
reads only the chosen experts' rows of a layer's stacked experts, on the Qwen3-30B-A3B expert shapes (128 experts, gate_up 1536 x 2048,
down 2048 x 768), bf16, on a CUDA GPU, against the path before it (tinygrad's own batched matmul over the gathered experts, w[ids]).

Correctness: each A (rows = tokens x 8 experts) against torch in float32 on the same bf16 inputs, NaN-poisoned output.
Speed: GB/s of expert bytes read (A x N x K x 2: a row's expert rows, once per row), each side one CUDA-graph replay over R distinct
stacks (> 1 GB together, so L2 never holds them), median of 7 timings; beside the device-to-device copy bandwidth.

  DEV=CUDA python scripts/bench_moe_gemv.py                   # A = 8, 32, 128, every rows-per-lane config
"""
import argparse, os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tinygrad import Tensor, TinyJit, Device, dtypes
from tinyvllm import gemm
from scripts.bench_gemm import timed, rel
from scripts.bench_gemv import copy_gbs, gemv_into

bf, E, k = dtypes.bfloat16, 128, 8
SHAPES = [("gate_up", 2048, 1536), ("down", 768, 2048)]   # (layer, K, N per expert)

def ids_for(A:int, seed:int) -> Tensor:   # each token's k distinct experts, as the router picks them
  import numpy as np
  rng = np.random.default_rng(seed)
  return Tensor(np.concatenate([rng.choice(E, k, replace=False) for _ in range(A // k)]).astype(np.int32))

def run(x:Tensor, w:Tensor, ids:Tensor, rows:int|None) -> Tensor:
  if rows is None: return gemm.matmul(x, w, experts=ids)   # what the engine picks
  lanes, K = 32, x.shape[1]
  vec = next(v for v in (4, 2, 1) if K * 2 % (4 * lanes * v) == 0)
  return gemv_into(Tensor.empty(ids.shape[0], w.shape[-2], dtype=x.dtype, device=x.device), x, w, (lanes, rows, vec), ids)

def gathered(x:Tensor, w:Tensor, ids:Tensor) -> Tensor:   # the path before: tinygrad's matmul over w[ids], a row per assignment
  T, K = x.shape; A = ids.shape[0]
  return (x.unsqueeze(1).expand(T, A // T, K).reshape(A, 1, K) @ w[ids].transpose(-1, -2)).reshape(A, -1)

if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--a", type=int, nargs="+", default=[8, 32, 128]); p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4])
  p.add_argument("--no-old", action="store_true", help="skip tinygrad's gathered matmul (slow to compile)")
  a = p.parse_args()
  import torch
  print(f"device: {torch.cuda.get_device_name()}, copy bandwidth (read + write) {(cp := copy_gbs()):.0f} GB/s", flush=True)
  sync = Device[Device.DEFAULT].synchronize
  for layer, K, N in SHAPES:
    R = max(2, (1 << 30) // (E * N * K * 2) + 1)
    ws = [(Tensor.randn(E, N, K) * 0.05).cast(bf).contiguous().realize() for _ in range(R)]
    for A in a.a:
      x, ids = Tensor.randn(A // k, K).cast(bf).realize(), [ids_for(A, s).realize() for s in range(R)]
      tx, tw, tid = (torch.from_numpy(t.float().numpy()).cuda() for t in (x, ws[0], ids[0]))
      ref = torch.einsum("ank,ak->an", tw[tid.long()], tx.repeat_interleave(k, 0))
      res, nbytes = {}, A * N * K * 2 * R
      for rows in [None] + a.rows + (["old"] if not a.no_old else []):
        f = (lambda i: gathered(x, ws[i], ids[i])) if rows == "old" else (lambda i, rows=rows: run(x, ws[i], ids[i], rows))
        got = torch.from_numpy(f(0).float().numpy()).cuda()
        assert torch.isfinite(got).all() and (e := rel(got, ref)) < 1e-2, f"{layer} A={A} rows={rows}: rel err {e}"
        res[rows] = nbytes / timed(TinyJit(lambda f=f: [f(i).realize() for i in range(R)]), sync) / 1e9
      print(f"{layer:>8} A={A:4d} K={K:5d} N={N:5d} | GB/s: engine {res[None]:5.0f} ({res[None] / cp:.0%} of copy) | " +
            " ".join(f"rows {r}: {res[r]:.0f}" for r in a.rows) + (f" | before (tinygrad, w[ids]): {res['old']:.0f}" if not a.no_old else ""), flush=True)
