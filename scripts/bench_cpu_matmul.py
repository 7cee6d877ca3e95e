"""The CPU's prompt-sized matmuls, kernel against kernel (issue #63): gemm.matmul as it routes them (tinygrad's matmul over W^T copied
into tiles of 8 columns, the copy included), our GEMV kernel as it ran them before, and tinygrad's plain matmul, at SmolLM2-135M's layer
shapes (and its LM head), float32, each inside a TinyJit and timed on its fourth call.

  python scripts/bench_cpu_matmul.py                    # rows 16 64 512
  python scripts/bench_cpu_matmul.py --rows 16 32 64 128 512
"""
import argparse, functools, os, sys, time, numpy as np
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # runs from a checkout
from tinygrad import Tensor, TinyJit, Device
from tinyvllm import gemm

# (K, N): q/k/v fused, o_proj, gate/up fused, down_proj, LM head (tied embeddings)
SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576), "lm_head": (576, 49152)}

def timed(fxn, reps:int=4) -> tuple[float, np.ndarray]:
  jit = TinyJit(fxn)
  for _ in range(reps):
    start = time.perf_counter(); out = jit().numpy(); seconds = time.perf_counter() - start
  return seconds, out

if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rows", type=int, nargs="+", default=[16, 64, 512])
  args = parser.parse_args()
  assert Device.DEFAULT == "CPU", "run it on the CPU (DEV=CPU)"
  for name, (K, N) in SHAPES.items():
    w = Tensor.randn(N, K).realize()
    for M in args.rows:
      x = Tensor.randn(M, K).realize()
      want, flops = x.numpy() @ w.numpy().T, 2 * M * N * K
      gemv = functools.partial(gemm._gemv_kernel, lanes=1, rows=2, vec=4)
      kernels = {"matmul (packed)": lambda: gemm.matmul(x, w).realize(),
                 "GEMV": lambda: Tensor.empty(M, N).custom_kernel(x, w, fxn=gemv)[0].realize(), "tinygrad x @ w.T": lambda: (x @ w.T).realize()}
      line = []
      for kernel, fxn in kernels.items():
        seconds, got = timed(fxn)
        assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max(), (name, M, kernel)
        line.append(f"{kernel} {seconds * 1e3:7.1f} ms {flops / seconds / 1e9:5.1f} GFLOP/s")
      print(f"{name:8s} M={M:4d} K={K:5d} N={N:6d} | " + " | ".join(line), flush=True)
