#!/usr/bin/env python3
"""Checks and times the small-M path of tinyvllm/gemm.py (the GEMV of decode steps of 1-15 rows) on the Llama-3.2-1B and Llama-3.1-8B
projection and LM-head shapes, bf16, on a CUDA GPU, against tinygrad's own matmul, the wgmma kernel forced to small M, and cuBLAS.

Correctness: every M from 1 to 16 on each shape (fresh random inputs, a NaN-poisoned output) against torch in float32 on the same bf16
inputs. Speed: GB/s of weight bytes read (the floor of a GEMV: N*K*2 bytes), each side one CUDA-graph replay over R distinct weight
matrices (> 256 MB together, so the 50 MB L2 never holds them), median of 7 timings; beside the device-to-device copy bandwidth.

  DEV=CUDA python scripts/bench_gemv.py                  # planned config at M = 1, 4, 8, 15
  DEV=CUDA python scripts/bench_gemv.py --sweep --m 1 8  # every (lanes, rows, vec) config"""
import argparse, itertools, os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tinygrad import Tensor, TinyJit, Device, dtypes
from tinyvllm import gemm
from scripts.bench_gemm import MODELS, shapes, timed, rel

bf = dtypes.bfloat16
SWEEP = [(32, r, 4) for r in (1, 2, 4, 8)]   # (lanes, rows, vec)

def gemv_into(out:Tensor, a:Tensor, w:Tensor, cfg, *experts:Tensor) -> Tensor:
  """The GEMV as gemm.matmul launches it, at cfg = (lanes, rows, vec); with experts, w (E, N, K) (scripts/bench_moe_gemv.py)."""
  import functools
  fxn = functools.partial(gemm._gemv_kernel, lanes=cfg[0], rows=cfg[1], vec=cfg[2])
  return out.custom_kernel(a, w.reshape(-1, w.shape[-1]), *experts, fxn=fxn)[0]

def check(M:int, K:int, N:int) -> float:
  """gemm.matmul, whichever kernel it routes M to, against torch."""
  import torch
  a, w = Tensor.randn(M, K).cast(bf).realize(), (Tensor.randn(N, K) * 0.05).cast(bf).realize()
  out = gemm.matmul(a, w)
  got, ta, tw = (torch.from_numpy(t.float().numpy()).cuda() for t in (out, a, w))
  assert torch.isfinite(got).all(), f"M={M} K={K} N={N} {cfg}: outputs not written"
  return rel(got, ta @ tw.T)

def speeds(M:int, K:int, N:int, cfgs:list) -> dict:
  """GB/s of weight bytes by name: each GEMV config, 'tinygrad' (x @ w.T), 'wgmma' (gemm's Hopper kernel at this M), 'cuBLAS'."""
  R = max(2, (1 << 28) // (N * K * 2) + 1); nbytes = N * K * 2 * R
  a, ws, sync = Tensor.randn(M, K).cast(bf).realize(), [(Tensor.randn(N, K) * 0.05).cast(bf).realize() for _ in range(R)], Device[Device.DEFAULT].synchronize
  res = {}
  def chain(cfg):   # one output buffer written in turn: the graph runs them one after another, as a model's layers do
    out = Tensor.empty(M, N, dtype=bf).contiguous().realize()
    for w in ws: out = gemv_into(out, a, w, cfg); out.realize()
  def wgmma():
    cfg = gemm.plan(max(M, 16), N, K); out = Tensor.empty(*(cfg[3],)*(cfg[3] > 1), M, N, dtype=dtypes.float if cfg[3] > 1 else bf).contiguous().realize()
    for w in ws:
      out = out.custom_kernel(a, w, fxn=gemm._kernel(M, N, K, a.device, *cfg))[0]; (out.sum(0).cast(bf) if cfg[3] > 1 else out).realize()
  fns = [(c, lambda c=c: chain(c)) for c in cfgs] + [("ours", lambda: [gemm.matmul(a, w).realize() for w in ws])]
  if TINYGRAD: fns.append(("tinygrad", lambda: [(a @ w.T).realize() for w in ws]))
  if Device[Device.DEFAULT].renderer.target.arch == "sm_90": fns.append(("wgmma", wgmma))
  for name, fn in fns: res[name] = nbytes / timed(TinyJit(fn), sync) / 1e9
  import torch
  ta, tws = torch.randn(M, K, device="cuda", dtype=torch.bfloat16), [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(R)]
  s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
  with torch.cuda.stream(s): [ta @ w.T for w in tws]
  torch.cuda.current_stream().wait_stream(s); g = torch.cuda.CUDAGraph()
  with torch.cuda.graph(g): _ = [ta @ w.T for w in tws]
  res["cuBLAS"] = nbytes / timed(g.replay, torch.cuda.synchronize) / 1e9
  return res

def copy_gbs() -> float:
  import torch
  src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
  return 2 * src.numel() / timed(lambda: dst.copy_(src), torch.cuda.synchronize) / 1e9

if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--m", type=int, nargs="+", default=[1, 4, 8, 15]); p.add_argument("--models", nargs="+", default=list(MODELS))
  p.add_argument("--sweep", action="store_true"); p.add_argument("--no-check", action="store_true")
  p.add_argument("--no-tinygrad", action="store_true", help="skip tinygrad's own matmul (slow to compile)")
  a = p.parse_args(); TINYGRAD = not a.no_tinygrad
  import torch
  torch.backends.cuda.matmul.allow_tf32 = False
  print(f"device: {torch.cuda.get_device_name()}, copy bandwidth (read + write) {(cp := copy_gbs()):.0f} GB/s", flush=True)
  rows = [(m, layer, K, N) for m in a.models for layer, K, N in shapes(MODELS[m])]
  if not a.no_check:
    for (m, layer, K, N), M in itertools.product(rows[:5], range(1, 17)):
      e = check(M, K, N); assert e < 1e-2, f"{layer} M={M}: rel err {e}"
    print("checked M = 1..16 on the 1B shapes against torch fp32: rel err < 1e-2", flush=True)
  for M in a.m:
    for m, layer, K, N in rows:
      cfgs = [c for c in SWEEP if (K // 2) % (c[0] * c[2]) == 0 and N % c[1] == 0] if a.sweep else []
      r = speeds(M, K, N, cfgs); best = max(cfgs + ["ours"], key=r.get)
      print(f"{m:>3} {layer:>8} M={M:2d} K={K:5d} N={N:6d} | GB/s: ours {r['ours']:5.0f} ({r['ours'] / cp:.0%} of copy), best {best} {r[best]:5.0f} "
            f"tinygrad {r.get('tinygrad', 0):5.0f} wgmma {r.get('wgmma', 0):5.0f} cuBLAS {r['cuBLAS']:5.0f}" +
            (" | " + " ".join(f"{c}:{r[c]:.0f}" for c in cfgs) if a.sweep else ""), flush=True)
