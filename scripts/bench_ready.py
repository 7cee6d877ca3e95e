#!/usr/bin/env python3
"""How soon a server answers (issue #40's start-up figures): launch `python -m tinyvllm.serve` with the given flags (bench_serving's
launch, which polls `/health` every 50 ms), then send three 8-token chat requests one after the other: a plain one, a `top_p` 0.9 one
and a `json_object` one (each needs another sampler variant, the last llguidance too). Prints, per start, the seconds from launch to
`/health` 200 and each answer's seconds. The first start on a machine fills tinygrad's cache.db; later ones are warm starts. To compare
two checkouts, run each one's own copy of this script.

  python scripts/bench_ready.py --runs 4                                                    # CPU, bundled model
  python scripts/bench_ready.py --runs 4 -- --model DIR --load-format dummy --device CUDA   # a scripts/configs shape, tokenizer beside it
"""
import argparse, time, httpx
from bench_serving import launch

if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--runs", type=int, default=3)
  p.add_argument("--url", default="http://127.0.0.1:8123")
  p.add_argument("server_args", nargs="*", help="after --: flags for tinyvllm.serve")
  args = p.parse_args()
  for run in range(args.runs):
    proc, start, _ = launch(argparse.Namespace(api_key=None, launch_timeout=1800, from_ready=True), args.server_args, args.url)
    try:
      healthy, seconds = time.perf_counter() - start, []
      for extra in ({}, {"top_p": 0.9}, {"response_format": {"type": "json_object"}}):
        t = time.perf_counter()
        httpx.post(f"{args.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **extra},
                   timeout=600).raise_for_status()
        seconds.append(time.perf_counter() - t)
      print(f"RESULT start {run}: /health after {healthy:.2f} s; then 8 tokens in {seconds[0]:.2f} s, top_p {seconds[1]:.2f} s, "
            f"json_object {seconds[2]:.2f} s", flush=True)
    finally:
      proc.terminate(); proc.wait()
