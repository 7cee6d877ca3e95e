#!/usr/bin/env python3
"""Every kernel of one engine step, timed by Nsight Compute inside the CUDA graph (the graph's nodes, serialized): where a step goes.

  ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --log-file dec.csv \
    python scripts/profile_ncu.py --config qwen3-30b-a3b --step decode
  python scripts/profile_ncu.py --table dec.csv          # the kernels in launch order, and their sum

--step decode profiles one batch-1 decode step (after 40 steps of a 200-token prompt); --step prefill one 1024-token prompt. Only the
profiler window (cuProfilerStart/Stop) is timed, so start-up is not. A tiny kernel shows ~2.5-3 us under ncu, less inside the graph;
the sum matched the engine's step time on an H100 (BENCHMARKS.md, 2026-11-27, whose call 1 ran this as a scratch copy). Dummy
weights from scripts/configs, as bench.py."""
import argparse, csv, ctypes, os, sys, time
import numpy as np

if __name__ == "__main__":
  p = argparse.ArgumentParser()
  p.add_argument("--config", default="qwen3-30b-a3b"); p.add_argument("--step", choices=["decode", "prefill"], default="decode")
  p.add_argument("--kv-cache-memory", type=float, default=4); p.add_argument("--table", help="print an ncu --csv log's kernels instead")
  args = p.parse_args()
  if args.table:
    rows = list(csv.reader(line for line in open(args.table) if not line.startswith("==")))
    name, value, grid = (rows[0].index(k) for k in ("Kernel Name", "Metric Value", "Grid Size"))
    kernels = [(r[name], float(r[value].replace(",", "")) / 1e3, r[grid]) for r in rows[1:]]
    for i, (n, us, g) in enumerate(kernels): print(f"{i:4d} {us:9.2f} us  {n}  grid {g}")
    sys.exit(print(f"{len(kernels)} kernels, {sum(us for _, us, _ in kernels):.1f} us"))
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from scripts.bench import model_folder
  from tinyvllm import LLM, SamplingParams
  from tinygrad import Device
  args.model = None
  folder, fmt = model_folder(args)
  llm = LLM(folder, device="CUDA", load_format=fmt, kv_cache_memory=args.kv_cache_memory)
  rng, libcuda = np.random.default_rng(0), ctypes.CDLL("libcuda.so.1")
  eng, sync = llm.engine, lambda: Device["CUDA"].synchronize()
  if args.step == "decode":
    eng.add_request(rng.integers(0, 10000, 200).tolist(), SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
    for _ in range(40): eng.step()
    sync(); libcuda.cuProfilerStart(); eng.step(); sync(); libcuda.cuProfilerStop()
  else:
    sync(); libcuda.cuProfilerStart(); t = time.perf_counter()
    eng.add_request(rng.integers(0, 10000, 1024).tolist(), SamplingParams(max_tokens=1))
    while eng.has_unfinished(): eng.step()
    sync(); libcuda.cuProfilerStop(); print(f"1024-token prompt under the profiler: {(time.perf_counter() - t) * 1e3:.1f} ms")
