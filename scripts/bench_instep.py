#!/usr/bin/env python3
"""The dense in-step attention of a prefill step (attention.in_step_attention), alone, in variants that cost no lines (issue #71), one layer,
TinyJit, best of 5 x 10 calls (bench.py's timer). Each variant returns the same (m, l, acc) partials; its error against the engine's form
is printed beside its time.

  python scripts/bench_instep.py --device CUDA                  # Llama-3.2-1B (D 64) and Llama-3.1-8B (D 128) heads, 1024 tokens
  python scripts/bench_instep.py --quick                        # small shapes: a smoke run on the CPU"""
import argparse, math, os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np
from scripts.bench import best_time   # noqa: E402

def variants():
  from tinygrad import Tensor, dtypes
  from tinyvllm.attention import in_step_attention
  def common(q, k, token_seq):
    (N, H, D), KVH = q.shape, k.shape[1]
    idx = Tensor.arange(N).to(q.device)
    s = q.reshape(N, KVH, H // KVH, D).permute(1, 2, 0, 3).matmul(k.permute(1, 2, 0).unsqueeze(1), dtype=dtypes.float) / math.sqrt(D)
    mask = (token_seq.unsqueeze(1) == token_seq.unsqueeze(0)) & (idx.unsqueeze(0) <= idx.unsqueeze(1))
    return N, H, s, mask
  to_nh = lambda t, N, H: t.permute(2, 0, 1, 3).reshape(N, H, t.shape[3])
  def finish(m, p, v, q, N, H, p16=True):
    acc = (p.cast(q.dtype) if p16 else p).matmul(v.permute(1, 0, 2).unsqueeze(1), dtype=dtypes.float).contiguous()
    return to_nh(m, N, H)[..., 0], to_nh(p.sum(-1, keepdim=True), N, H)[..., 0], to_nh(acc, N, H)
  def scores16(q, k, v, token_seq):   # scores stored in 16 bits; max and sum in float32
    N, H, s, mask = common(q, k, token_seq)
    s = mask.where(s, -math.inf).cast(q.dtype)
    m = s.max(-1, keepdim=True).float()
    return finish(m, (s.float() - m).exp(), v, q, N, H)
  def p16_realized(q, k, v, token_seq):   # P realized once in 16 bits (read by P x V and by its sum)
    N, H, s, mask = common(q, k, token_seq)
    s = mask.where(s, -math.inf)
    m = s.max(-1, keepdim=True)
    p = (s - m).exp().cast(q.dtype).contiguous()
    acc = p.matmul(v.permute(1, 0, 2).unsqueeze(1), dtype=dtypes.float).contiguous()
    return to_nh(m, N, H)[..., 0], to_nh(p.float().sum(-1, keepdim=True), N, H)[..., 0], to_nh(acc, N, H)
  def scores16_p16(q, k, v, token_seq):   # both
    N, H, s, mask = common(q, k, token_seq)
    s = mask.where(s, -math.inf).cast(q.dtype)
    m = s.max(-1, keepdim=True).float()
    p = (s.float() - m).exp().cast(q.dtype).contiguous()
    acc = p.matmul(v.permute(1, 0, 2).unsqueeze(1), dtype=dtypes.float).contiguous()
    return to_nh(m, N, H)[..., 0], to_nh(p.float().sum(-1, keepdim=True), N, H)[..., 0], to_nh(acc, N, H)
  def ones_column(q, k, v, token_seq):   # the sum of P as one more column of V (1s), so P x V computes it: one read of P fewer
    N, H, s, mask = common(q, k, token_seq)
    s = mask.where(s, -math.inf)
    m = s.max(-1, keepdim=True)
    D = v.shape[-1]
    acc = (s - m).exp().cast(q.dtype).matmul(v.permute(1, 0, 2).unsqueeze(1).pad((None, None, None, (0, 16)), value=1), dtype=dtypes.float)
    acc = to_nh(acc.contiguous(), N, H)
    return to_nh(m, N, H)[..., 0], acc[..., D], acc[..., :D]
  engine = lambda q, k, v, ts: in_step_attention(q, k, v, ts, True)
  return {"engine (today)": engine, "scores in 16 bits": scores16, "P realized in 16 bits": p16_realized,
          "scores and P in 16 bits": scores16_p16, "sum as a ones column of V": ones_column}

def case(name, N, H, KVH, D, dt, seqs):
  from tinygrad import Tensor, TinyJit, dtypes
  rng = np.random.default_rng(0)
  q, k, v = [Tensor(rng.standard_normal((N, h, D)).astype(np.float32)).cast(dt).realize() for h in (H, KVH, KVH)]
  ts = Tensor(np.repeat(np.arange(seqs), N // seqs).astype(np.int32)).realize()
  ref = None
  for label, fxn in variants().items():
    f = TinyJit(lambda q, k, v, fxn=fxn: [t.realize() for t in fxn(q, k, v, ts)])
    try: t = best_time(f, q, k, v)
    except Exception as e: print(f"{name}: {label}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True); continue
    m, l, acc = [x.float().numpy() for x in fxn(q, k, v, ts)]
    out = acc / l[..., None]
    ref = out if ref is None else ref
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    flops = 4 * N * N * H * D / seqs / 2   # causal: half of the N x N scores, two matmuls
    print(f"{name}: {label}: {t*1e6:.1f} us per layer ({flops/t/1e12:.1f} TFLOP/s causal), rel err vs engine {err:.2e}", flush=True)

if __name__ == "__main__":
  p = argparse.ArgumentParser()
  p.add_argument("--device"); p.add_argument("--quick", action="store_true"); p.add_argument("--tokens", type=int, default=1024)
  a = p.parse_args()
  if a.device: os.environ["DEV"] = a.device
  from tinygrad import dtypes
  if a.quick: case("quick", 64, 4, 2, 16, dtypes.float32, 1)
  else:
    for name, H, KVH, D in (("1B heads (32/8, D 64)", 32, 8, 64), ("8B heads (32/8, D 128)", 32, 8, 128)):
      case(f"{name}, {a.tokens} tokens", a.tokens, H, KVH, D, dtypes.bfloat16, 1)
