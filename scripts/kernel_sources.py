#!/usr/bin/env python3
"""Every kernel source of a one-layer engine, rendered and compiled for a GPU on the NULL device (nothing executes), one hash a line:
a change that must leave the kernels alone is checked without a GPU by running this on two trees and diffing the output.

  LD_LIBRARY_PATH=<nvidia/cuda_nvrtc/lib> DEV=NULL:CUDA:sm_90 NULL_ALLOW_COPYOUT=1 PYTHONPATH=<tree> \\
    python scripts/kernel_sources.py llama-3.2-1b bfloat16 > a.txt          # then the other tree into b.txt; diff a.txt b.txt

The run is tests/test_renderers.py's own (run_engine: a 1024-token prompt and a greedy decode step, an 8-token prompt and a decode step
through the filtering sampler); nvrtc for CUDA comes from PyPI's nvidia-cuda-nvrtc-cu12."""
import hashlib, os, sys

if __name__ == "__main__":
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
  import tinygrad.engine.realize as realize
  from test_renderers import run_engine
  to_program, seen = realize.to_program, set()
  def recorded(ast, ren):
    prg = to_program(ast, ren)
    # the PROGRAM's SOURCE: the kernel's code as the compiler gets it
    seen.add(f"{prg.arg.function_name} {hashlib.sha256(prg.src[2].arg.encode()).hexdigest()[:16]}")
    return prg
  # run_engine wraps realize.to_program in turn, and calls this one for the device's own kernels
  realize.to_program = recorded
  run_engine(sys.argv[1], sys.argv[2])
  for line in sorted(seen): print(line)
