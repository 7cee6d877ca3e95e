#!/usr/bin/env python3
"""How soon a server answers (issue #40's start-up figures): launch `python -m tinyvllm.serve` with the given flags, poll `/health` every
20 ms, then send three 8-token chat requests one after the other: a plain one, a `top_p` 0.9 one and a `json_object` one (each needs
another sampler variant, the last llguidance too). Prints, per start, the seconds from launch to `/health` 200 and each answer's seconds.
The first start on a machine fills tinygrad's cache.db; later ones are warm starts.

  python scripts/bench_ready.py --runs 4                                                    # CPU, bundled model
  python scripts/bench_ready.py --runs 4 --tree OTHER_CHECKOUT -- --seed 11                 # another tree's tinyvllm (its own cache key)
  python scripts/bench_ready.py --runs 4 -- --model DIR --load-format dummy --device CUDA   # a scripts/configs shape, tokenizer beside it
"""
import argparse, json, os, subprocess, sys, time, urllib.request

def post(port:int, **extra) -> float:
  body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **extra}
  t = time.perf_counter()
  urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                                {"Content-Type": "application/json"})).read()
  return time.perf_counter() - t

if __name__ == "__main__":
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--runs", type=int, default=3)
  p.add_argument("--port", type=int, default=8123)
  p.add_argument("--tree", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), help="the checkout whose tinyvllm runs")
  p.add_argument("--log", default=None, help="the server's stderr goes to LOG.N for start N (default: discarded)")
  p.add_argument("server_args", nargs="*", help="after --: flags for tinyvllm.serve")
  args = p.parse_args()
  for run in range(args.runs):
    start = time.perf_counter()
    log = open(f"{args.log}.{run}", "w") if args.log else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-m", "tinyvllm.serve", "--port", str(args.port), *args.server_args], cwd=args.tree,
                            stdout=subprocess.DEVNULL, stderr=log)
    try:
      while True:
        if proc.poll() is not None: sys.exit(f"the server exited with {proc.returncode}")
        try: urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=1); break
        except Exception: time.sleep(0.02)
      healthy = time.perf_counter() - start
      plain, top_p, json_object = post(args.port), post(args.port, top_p=0.9), post(args.port, response_format={"type": "json_object"})
      print(f"start {run}: /health after {healthy:.2f} s; then 8 tokens in {plain:.2f} s, top_p {top_p:.2f} s, json_object {json_object:.2f} s",
            flush=True)
    finally:
      proc.terminate(); proc.wait()
