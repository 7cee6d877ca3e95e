#!/usr/bin/env python3
"""One Qwen3-30B-A3B mixture-of-experts block (`Transformer.experts`: router, routing, both expert projections, the weighted sum; E=128,
k=8, hidden 2048, expert width 768, bf16, random weights) in a TinyJit, milliseconds per call at each step size, for the path the engine
picks (default) and with the GEMV/tiles threshold forced either way, to find where the tiles start to pay on a device:

  DEV=CUDA python scripts/bench_moe_block.py --tokens 16 32 48 64 128 256 512 1024 --paths default gemv tiles

`gemv` and `tiles` rewrite the threshold line of `Transformer.experts` (`if A < (...) * E:`) in this process only. --save DIR writes each
output as .npy (inputs seeded by the step size), so two trees' outputs can be compared."""
import argparse, inspect, os, re, textwrap, time, numpy as np
from tinygrad import Tensor, dtypes, Device, TinyJit
import tinyvllm.model as model

E, K_EXPERTS, D, I = 128, 8, 2048, 768
PATHS = {"default": None, "gemv": "A < 2**62:", "tiles": "A < 1:"}   # under the threshold, rows take the GEMV

def block(path:str|None):
  """Transformer.experts, its threshold replaced where a path is forced."""
  if path is None: return model.Transformer.experts
  src, ns = textwrap.dedent(inspect.getsource(model.Transformer.experts)), {}
  forced = re.sub(r"A < \(.*\) \* E:", path, src)
  assert forced != src, "the threshold line of Transformer.experts changed: update this script"
  exec(forced, model.__dict__, ns); return ns["experts"]

def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--tokens", type=int, nargs="+", default=[8, 32, 64, 128, 256, 1024])
  p.add_argument("--paths", nargs="+", choices=PATHS, default=["default"])
  p.add_argument("--dtype", default="bfloat16", help="float32 on a CPU whose compiler lacks bf16")
  p.add_argument("--save", help="a folder for each output as PATH_TOKENS.npy")
  args = p.parse_args()
  dtype, cfg = getattr(dtypes, args.dtype), {"num_experts": E, "num_experts_per_tok": K_EXPERTS, "norm_topk_prob": True,
                                            "moe_names": ("mlp", "gate_proj", "up_proj", "down_proj")}
  Tensor.manual_seed(0)
  u = lambda *shape: Tensor.uniform(*shape, low=-0.05, high=0.05, dtype=dtype).realize()
  w = {"l.mlp.gate.weight": u(E, D), "l.experts.gate_up.weight": u(E * 2 * I, D), "l.experts.down.weight": u(E * D, I)}
  m = model.Transformer.__new__(model.Transformer); m.hf_config, m.w = cfg, w   # the block alone: no attention, no embeddings
  print(f"device {Device.DEFAULT}; one MoE block (E={E}, k={K_EXPERTS}, hidden {D}, expert width {I}, {args.dtype}), ms per call")
  for name in args.paths:
    experts, times = block(PATHS[name]), []
    for n in args.tokens:
      Tensor.manual_seed(n); x = (Tensor.randn(n, D) * 2).cast(dtype).realize()
      f = TinyJit(lambda x: experts(m, x, "l.").realize())
      for _ in range(3): out = f(x)
      best = float("inf")
      for _ in range(5):
        Device[Device.DEFAULT].synchronize(); t = time.perf_counter()
        for _ in range(10): out = f(x)
        Device[Device.DEFAULT].synchronize(); best = min(best, (time.perf_counter() - t) / 10)
      if args.save: np.save(os.path.join(args.save, f"{name}_{n}.npy"), out.float().numpy())
      times.append(f"{n}: {best * 1e3:.3f}")
    print(f"{name:>8} | tokens: ms | " + " | ".join(times), flush=True)

if __name__ == "__main__": main()
