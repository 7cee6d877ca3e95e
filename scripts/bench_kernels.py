#!/usr/bin/env python3
"""Microbenchmarks behind four engine decisions, at Llama-3.2-1B shapes (bf16 on GPUs), one layer, TinyJit, best of 5 x 10 calls:

1. attention: `paged_attention` as the runner calls it, the kernel reading everything vs the kernel on the cached prefix + the dense in-step
   matmuls (what DENSE_MIN / DENSE_MAX in tinyvllm/attention.py choose between), for decode and prefill steps;
2. MLP: the down matmul reading silu(gate)*up fused into its loads vs from a contiguous buffer (and the norm made contiguous too);
3. linear: each projection's matmul with tinygrad's default tensor-core schedule vs split over its reduction (K) into S partial matmuls
   summed afterwards, and (--beam) with tinygrad's BEAM search;
4. sampler: `sample` on (R, vocab) float32 logits, plain (temperature + Gumbel-max), with a grammar bitmask, and with the mask plus
   top-k/top-p (why the runner keeps the filtering variant in a graph of its own, used only by batches that need it).

  python scripts/bench_kernels.py --device CUDA
  python scripts/bench_kernels.py --device CUDA --only linear --beam 2
  python scripts/bench_kernels.py --quick          # small shapes: a smoke run on CPU"""
import argparse, os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np
from scripts.bench import best_time   # noqa: E402  (bench.py's timer: TinyJit warm-up, best of 5 x 10 calls between syncs)

def attention_case(name, S, ctx, prefill, H, KVH, D, BS, dt):
  from tinygrad import Tensor, TinyJit
  import tinyvllm.attention as A
  MB = -(-ctx // BS); NBLK = S * MB + 8
  kp, vp = [A.words(Tensor.uniform(NBLK*BS, KVH, D, dtype=dt)).contiguous().realize() for _ in "kv"]   # as the runner's pools
  bt = Tensor(np.random.default_rng(0).permutation(NBLK)[:S*MB].reshape(S, MB).astype(np.int32)).realize()
  N = ctx if prefill else S
  ts = Tensor(np.zeros(N, np.int32) if prefill else np.arange(S, dtype=np.int32)).realize()
  pos = np.arange(ctx, dtype=np.int32) if prefill else np.full(S, ctx - 1, np.int32)
  cached, pos = Tensor(np.zeros(N, np.int32) if prefill else pos).realize(), Tensor(pos).realize()
  qkv = Tensor.uniform(N, H + 2*KVH, D, dtype=dt).realize()   # the heads of q, k and v, as the model passes them
  for label, lo, hi in (("kernel only", 1, 0), ("kernel on cached prefix + dense in-step", 0, 1 << 30)):
    A.DENSE_MIN, A.DENSE_MAX = lo, hi
    f = TinyJit(lambda qkv: A.paged_attention(qkv, kp, vp, bt, ts, pos, cached, BS).realize())
    print(f"attention {name}, {label}: {best_time(f, qkv)*1e6:.1f} us per layer", flush=True)

def mlp_case(N, Dm, I, dt):
  from tinygrad import Tensor, TinyJit
  x, nw = Tensor.uniform(N, Dm, dtype=dt).realize(), Tensor.uniform(Dm, dtype=dt).realize()
  wgu, wd = Tensor.uniform(2*I, Dm, dtype=dt, low=-.02, high=.02).realize(), Tensor.uniform(Dm, I, dtype=dt, low=-.02, high=.02).realize()
  def mlp(x, contiguous_norm, contiguous_act):
    xf = x.float(); h = (xf * (xf.square().mean(-1, keepdim=True) + 1e-5).rsqrt()).cast(x.dtype) * nw
    gate, up = ((h.contiguous() if contiguous_norm else h) @ wgu.T).chunk(2, -1)
    act = gate.silu() * up
    return ((act.contiguous() if contiguous_act else act) @ wd.T).realize()
  for cn, ca in ((False, False), (False, True), (True, True)):
    t = best_time(TinyJit(lambda x, cn=cn, ca=ca: mlp(x, cn, ca)), x)
    print(f"MLP N={N}: contiguous norm {cn}, contiguous activation {ca}: {t*1e3:.3f} ms ({2*N*Dm*3*I/t/1e12:.1f} TFLOP/s)", flush=True)

def split_k_ways(N:int, K:int, O:int) -> int:
  """split-K, the engine's rule before gemm.py (kept here as the old path that this script and bench_gemm.py measure), as cuBLAS does for
  skinny outputs: a tensor-core matmul (16+ rows) with under 4M outputs gives tinygrad's schedule too few tiles to fill the GPU, so its reduction is split S ways (S times the tiles), each part still a multiple of the tensor cores' 16 (the rule
  was picked from a measured sweep: BENCHMARKS.md, change 7)."""
  S = 1
  while N >= 16 and S < 8 and N * O * S * 2 < 1 << 22 and K % (S * 2 * 16) == 0: S *= 2
  return S

def matmul_split_k(x, w, S:int):
  """x (N, K) @ w (O, K).T as S partial matmuls over K/S each (one batched, single-reduce matmul), summed in float32."""
  (N, K), O = x.shape, w.shape[0]
  from tinygrad import dtypes
  return x.reshape(N, S, K//S).permute(1, 0, 2).matmul(w.reshape(O, S, K//S).permute(1, 2, 0), dtype=dtypes.float).contiguous().sum(0)

def linear_case(name, N, K, O, dt, beam):
  from tinygrad import Tensor, TinyJit
  from tinygrad.helpers import Context
  x, w = Tensor.uniform(N, K, dtype=dt).realize(), Tensor.uniform(O, K, dtype=dt, low=-.02, high=.02).realize()
  for S, b in [(S, 0) for S in (1, 2, 4, 8) if K % (S * 16) == 0] + ([(1, beam)] if beam else []):
    f = lambda x, S=S: (x @ w.T if S == 1 else matmul_split_k(x, w, S).cast(dt)).realize()
    with Context(BEAM=b): t = best_time(TinyJit(f), x)
    pick = " (the old rule's choice)" if S == split_k_ways(N, K, O) and not b else ""
    print(f"linear {name} N={N} K={K} O={O}: split {S}{f', BEAM={b}' if b else ''}{pick}: {t*1e6:.1f} us ({2*N*K*O/t/1e12:.1f} TFLOP/s)",
          flush=True)

def sampler_case(R, V):
  from tinygrad import Tensor, TinyJit, dtypes
  from tinyvllm.sampler import sample
  rng = np.random.default_rng(0)
  logits = Tensor(rng.standard_normal((R, V)).astype(np.float32)).realize()
  temperatures, seeds = Tensor(np.full(R, 0.6, np.float32)).realize(), Tensor(np.arange(R, dtype=np.int32)).realize()
  positions = Tensor(np.arange(R, dtype=np.int32) + 100).realize()
  top_k, top_p, min_p = Tensor(np.full(R, V, np.int32)).realize(), Tensor(np.ones(R, np.float32)).realize(), Tensor(np.zeros(R, np.float32)).realize()
  allowed = Tensor.full((R, -(-V // 32)), -1, dtype=dtypes.int32).contiguous().realize()
  variants = {"plain": (), "+ grammar mask": (None, None, None, allowed), "+ grammar mask + top-k/top-p/min-p": (top_k, top_p, min_p, allowed)}
  for name, filters in variants.items():
    f = TinyJit(lambda *args, filters=filters: sample(*args, *filters).contiguous().realize())
    print(f"sampler R={R} V={V} {name}: {best_time(f, logits, temperatures, seeds, positions)*1e3:.3f} ms", flush=True)

if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--device"); p.add_argument("--quick", action="store_true"); p.add_argument("--beam", type=int, default=0)
  p.add_argument("--only", nargs="+", default=["attention", "mlp", "linear", "sampler"], choices=["attention", "mlp", "linear", "sampler"])
  p.add_argument("--linear-n", type=int, nargs="+", default=[256, 1024], help="token counts (rows) of the linear cases")
  p.add_argument("--heads", type=int, nargs=4, help="attention: H KVH head_dim block_size (default 32 8 64 16, Llama-3.2-1B; 8B: 32 8 128 16)")
  a = p.parse_args()
  from tinyvllm.config import select_device
  dev = select_device(a.device)
  from tinygrad import dtypes
  dt = dtypes.float32 if dev.startswith("CPU") else dtypes.bfloat16
  heads = a.heads or ((8, 2, 16, 4) if a.quick else (32, 8, 64, 16))   # H, KVH, head_dim, block_size
  cases = [("decode b4 ctx64", 4, 64, False), ("prefill 128", 1, 128, True)] if a.quick else \
    [("decode b1 ctx512", 1, 512, False), ("decode b256 ctx512", 256, 512, False), ("decode b256 ctx1024", 256, 1024, False), ("prefill 1024", 1, 1024, True), ("prefill 2048", 1, 2048, True)]
  if "attention" in a.only:
    for name, S, ctx, prefill in cases: attention_case(name, S, ctx, prefill, *heads, dt)
  if "mlp" in a.only:
    for N in ((16,) if a.quick else (256, 1024)): mlp_case(N, *((64, 256) if a.quick else (2048, 8192)), dt)
  if "linear" in a.only:   # Llama-3.2-1B's projections: (K, O)
    shapes = [("down", 256, 64)] if a.quick else [("qkv", 2048, 3072), ("o", 2048, 2048), ("gate_up", 2048, 16384), ("down", 8192, 2048)]
    for N in ((16,) if a.quick else a.linear_n):
      for name, K, O in shapes: linear_case(name, N, K, O, dt, a.beam)
  if "sampler" in a.only:
    for R in ((1, 4) if a.quick else (1, 64, 256)): sampler_case(R, 512 if a.quick else 128256)
