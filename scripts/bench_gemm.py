#!/usr/bin/env python3
"""Checks and times tinyvllm's tensor-core GEMM (tinyvllm/gemm.py) on the projection and LM-head shapes of Llama-3.2-1B and Llama-3.1-8B
(fused qkv and gate/up, as the model runs them), bf16, on a Hopper GPU.

Correctness, per shape, on fresh random inputs: the kernel writes into a NaN-poisoned buffer; rel err = ||out - ref|| / ||ref|| against
torch in float32 on the same bf16 inputs and against tinygrad's own matmul; every element must be finite. Then the kernel inside a TinyJit,
fused with other ops, over new inputs on each call, against eager tinygrad.

Speed: TFLOP/s of the kernel, of the path the engine had before it (tinygrad's matmul, split over K where `split_k_ways` says so) and of
cuBLAS (torch.matmul), measured in the same run. Each side is one CUDA-graph replay (TinyJit / torch.cuda.graph) of R matmuls over R
distinct weights, so launches amortize and the weights stream from memory as in a real step; median of 7 timings after warm-up.

  DEV=CUDA python scripts/bench_gemm.py                      # the table for BENCHMARKS.md
  DEV=CUDA python scripts/bench_gemm.py --sweep --m 64 256   # every config at each shape: what gemm.plan was picked from
  DEV=CUDA python scripts/bench_gemm.py --sweep --m 1024 --models 8B --configs 128,256,4,1 256,128,4,1   # only these configs"""
import argparse, os, statistics, sys, time
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tinygrad import Tensor, TinyJit, Device, dtypes
from tinyvllm import gemm
from scripts.bench_kernels import split_k_ways, matmul_split_k

MODELS = {"1B": dict(D=2048, I=8192, H=32, KV=8, hd=64, V=128256), "8B": dict(D=4096, I=14336, H=32, KV=8, hd=128, V=128256)}
CONFIGS = [(128, 256, 4, S) for S in (1, 2, 4, 8)] + [(64, 128, ST, S) for ST in (4, 8) for S in (1, 2, 4, 8)]   # (BM, BN, stages, split)
bf = dtypes.bfloat16

def shapes(c:dict) -> list[tuple[str, int, int]]:   # (layer, K, N) of y[M, N] = x[M, K] @ w[N, K].T
  return [("qkv", c["D"], (c["H"] + 2*c["KV"]) * c["hd"]), ("o", c["H"] * c["hd"], c["D"]), ("gate_up", c["D"], 2*c["I"]),
          ("down", c["I"], c["D"]), ("lm_head", c["D"], c["V"])]

def valid(M:int, K:int, N:int, cfg) -> bool:
  BM, BN, ST, S = cfg
  return N % BN == 0 and K % (S*64) == 0 and K // S >= 64 * (ST-2) and (BM == 64 or M > 64)

def timed(call, sync) -> float:
  """Median seconds per call: 3 warm-up calls (a TinyJit runs eagerly, captures, then replays), then 7 timings of n calls each."""
  for _ in range(3): call()
  sync(); t = time.perf_counter(); call(); sync(); n = max(2, int(0.02 / (time.perf_counter() - t)))
  ts = []
  for _ in range(7):
    sync(); t = time.perf_counter()
    for _ in range(n): call()
    sync(); ts.append((time.perf_counter() - t) / n)
  return statistics.median(ts)

def rel(x, ref) -> float: return ((x - ref).norm() / ref.norm()).item()   # torch tensors, on the GPU

def kernel(a:Tensor, w:Tensor, cfg, out:Tensor) -> tuple[Tensor, Tensor]:
  """gemm.matmul with a given config, writing `out` (M, N), or (S, M, N) float32 partials: (result, `out` after the kernel)."""
  (M, K), N, S = a.shape, w.shape[0], cfg[3]
  out = out.custom_kernel(a, w, fxn=gemm._kernel(M, N, K, a.device, *cfg))[0]
  return (out.sum(0).cast(bf) if S > 1 else out), out

def workspace(M:int, N:int, S:int) -> Tensor: return Tensor.empty(*(S,)*(S > 1), M, N, dtype=dtypes.float if S > 1 else bf)

def check(M:int, K:int, N:int, cfg) -> tuple[float, float]:
  """(rel err vs torch fp32, rel err vs tinygrad's matmul) of the kernel with `cfg`, on fresh inputs, into a NaN-poisoned output."""
  import torch
  a, w = Tensor.randn(M, K).cast(bf).realize(), (Tensor.randn(N, K) * 0.05).cast(bf).realize()
  poisoned = workspace(M, N, cfg[3]).full_like(float("nan")).contiguous().realize()
  out, tg, ta, tw = (torch.from_numpy(t.float().numpy()).cuda() for t in (kernel(a, w, cfg, poisoned)[0], a @ w.T, a, w))
  assert torch.isfinite(out).all(), f"{M}x{K}x{N} {cfg}: {(~torch.isfinite(out)).sum().item()} outputs not written or not finite"
  return rel(out, ta @ tw.T), rel(out, tg)

def jit_check(K:int=2048, N:int=8192):
  """gemm.matmul inside a TinyJit with other ops around it (a lazy input, a lazy consumer), over new inputs each call, without and with
  split-K."""
  import torch
  w = (Tensor.randn(N, K) * 0.05).cast(bf).realize()
  for M, cfg in ((256, (128, 256, 4, 1)), (64, (64, 128, 4, 4))):
    f = TinyJit(lambda x: gemm.matmul(x * 2, w, cfg).silu().realize())
    for i in range(3):
      x = Tensor.randn(M, K).cast(bf).realize()
      got, want = (torch.from_numpy(t.float().numpy()) for t in (f(x), ((x * 2) @ w.T).silu()))
      print(f"TinyJit call {i} (M={M} K={K} N={N} {cfg}, silu(gemm(2x, w))): rel err vs eager tinygrad {(e := rel(got, want)):.1e}")
      assert e < 2e-2

def speeds(M:int, K:int, N:int, cfgs:list, old=True, cublas=True) -> dict:
  """TFLOP/s by name: each config of the kernel, 'old' (the engine's path before the kernel) and 'cuBLAS'."""
  flop, R = 2*M*N*K, max(2, min(8, (1 << 29) // (N*K*2)))
  a, ws, sync = Tensor.randn(M, K).cast(bf).realize(), [(Tensor.randn(N, K) * 0.05).cast(bf).realize() for _ in range(R)], Device["CUDA"].synchronize
  res, S = {}, split_k_ways(M, K, N)
  # the kernels write one buffer in turn, so the graph orders them as torch's captured stream does (independent GEMMs overlap and
  # flattered small grids); split-K's sum is realized after each. tinygrad's own matmuls can't share an output: the old path runs unordered
  def chain(cfg):
    out = workspace(M, N, cfg[3])
    for w in ws: (y, out) = kernel(a, w, cfg, out); y.realize()
  old_fn = lambda a, w: a @ w.T if S == 1 else matmul_split_k(a, w, S).cast(bf)
  for name, fn in [(c, lambda c=c: chain(c)) for c in cfgs] + ([("old", lambda: [old_fn(a, w).realize() for w in ws])] if old else []):
    res[name] = flop * R / timed(TinyJit(fn), sync) / 1e12   # no JIT inputs: the replay patches nothing, as torch's graph
  if cublas:
    import torch
    ta, tws = torch.randn(M, K, device="cuda", dtype=torch.bfloat16), [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(R)]
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())   # torch's recipe: warm up on a side stream, then capture
    with torch.cuda.stream(s): [ta @ w.T for w in tws]
    torch.cuda.current_stream().wait_stream(s); g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g): _ = [ta @ w.T for w in tws]
    res["cuBLAS"] = flop * R / timed(g.replay, torch.cuda.synchronize) / 1e12
  del a, ws
  return res

def moe_tiles(tiles:int, K:int, N:int, E:int=128, T:int=64):
  """MoE prefill: x's tiles of T rows, each owned by one expert of the stacked (E, N, K) weights. The wgmma kernel with an expert per tile
  against torch (fp32, per tile), into a NaN-poisoned output, then its speed against tinygrad's matmul of the tiles (the portable path,
  SM90A_GEMM=0) in the same run, each in a TinyJit over fresh owners."""
  import torch
  x, w = Tensor.randn(tiles * T, K).cast(bf).realize(), (Tensor.randn(E, N, K) * 0.05).cast(bf).realize()
  owner = Tensor(np.random.default_rng(tiles).integers(0, E, tiles).astype(np.int32)).realize()
  experts = owner.reshape(tiles, 1).expand(tiles, T)
  out = gemm.matmul(x, w, experts=experts).numpy().astype(np.float32)
  tx, tw, to = (torch.from_numpy(t.float().numpy()) for t in (x, w, owner))
  want = torch.einsum("tik,tnk->tin", tx.reshape(tiles, T, K), tw[to.long()]).reshape(tiles * T, N)
  err = rel(torch.from_numpy(out), want); assert np.isfinite(out).all() and err < 1e-2, err
  res, flop = {}, 2 * tiles * T * N * K
  for name, env in (("wgmma", "1"), ("tinygrad", "0")):
    os.environ["SM90A_GEMM"] = env
    f = TinyJit(lambda x, e: gemm.matmul(x, w, experts=e).realize())
    res[name] = flop / timed(lambda: f(x, experts.contiguous().realize()), Device["CUDA"].synchronize) / 1e12
  os.environ.pop("SM90A_GEMM")
  print(f"MoE tiles={tiles} T={T} K={K} N={N} E={E}: rel err vs torch fp32 {err:.1e}; TFLOP/s wgmma {res['wgmma']:.1f}, "
        f"tinygrad {res['tinygrad']:.1f}", flush=True)

if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--m", type=int, nargs="+", default=[256, 1024, 4096], help="rows (tokens in the step)")
  p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
  p.add_argument("--sweep", action="store_true", help="time every valid config in CONFIGS instead of the planned one")
  p.add_argument("--layers", nargs="+", help="sweep only these layers")
  p.add_argument("--configs", nargs="+", help="BM,BN,stages,split each: check and sweep these instead of CONFIGS (BM a multiple of 64, "
                 "BN of 8 up to 256, stages*(BM+BN)*128 bytes of shared memory at most 227 KB)")
  p.add_argument("--no-old", action="store_true", help="skip timing the engine's old tinygrad path (slow to compile and run)")
  p.add_argument("--moe", action="store_true", help="only the MoE prefill tiles (Qwen3-30B-A3B's gate_up and down at 1024 tokens)")
  a = p.parse_args()
  if a.configs: CONFIGS = [tuple(map(int, c.split(","))) for c in a.configs]
  if a.moe:
    for tiles, K, N in ((256, 2048, 1536), (256, 768, 2048), (48, 2048, 1536)): moe_tiles(tiles, K, N)
    sys.exit()
  import torch
  torch.backends.cuda.matmul.allow_tf32 = False   # the float32 reference must be float32
  print(f"device: {torch.cuda.get_device_name()}, tinygrad {Device.DEFAULT}")
  for cfg in CONFIGS:   # every config, at a ragged M (zero-filled rows, masked stores) and a full one
    for M in [M for M in (100, 256) if valid(M, 2048, 4096, cfg)]:
      e = check(M, 2048, 4096, cfg)
      print(f"config {cfg} M={M} K=2048: rel err vs torch fp32 {e[0]:.1e}, vs tinygrad {e[1]:.1e}", flush=True)
      assert e[0] < 1e-2, "wrong results"
  jit_check()
  rows = [(m, layer, K, N) for m in a.models for layer, K, N in shapes(MODELS[m])]
  if a.sweep:
    print(f"{'model':>5} {'layer':>8} {'M':>5} {'K':>5} {'N':>6} | TFLOP/s of configs {CONFIGS} | cuBLAS | best")
    for M in a.m:
      for m, layer, K, N in rows:
        if a.layers and layer not in a.layers: continue
        r = speeds(M, K, N, cfgs := [c for c in CONFIGS if valid(M, K, N, c)], old=False)
        print(f"{m:>5} {layer:>8} {M:5d} {K:5d} {N:6d} | " + " ".join(f"{r[c]:5.0f}" if c in r else "    -" for c in CONFIGS) +
              f" | {r['cuBLAS']:5.0f} | {(b := max(cfgs, key=r.get))} {r[b] / r['cuBLAS']:.0%}  plan {gemm.plan(M, N, K)}", flush=True)
    sys.exit()
  print(f"{'model':>5} {'layer':>8} {'M':>5} {'K':>5} {'N':>6} {'config':>16} | TFLOP/s: ours  old  cuBLAS | ours/cuBLAS | "
        "rel err vs torch fp32, vs tinygrad")
  for M in a.m:
    for m, layer, K, N in rows:
      c = gemm.plan(M, N, K)
      e_torch, e_tg = check(M, K, N, c)
      r = speeds(M, K, N, [c], old=not a.no_old)
      print(f"{m:>5} {layer:>8} {M:5d} {K:5d} {N:6d} {str(c):>16} | {r[c]:13.1f} {r.get('old', float('nan')):5.1f} {r['cuBLAS']:7.1f} | "
            f"{r[c] / r['cuBLAS']:11.0%} | {e_torch:.1e}, {e_tg:.1e}", flush=True)
