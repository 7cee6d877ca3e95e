#!/usr/bin/env python3
"""The CPU's start-up and its prompt-sized graphs (issue #72), default flags:

  python scripts/bench_cpu_start.py start --model ~/SmolLM2          # seconds for LLM(model, device="CPU") in this fresh process
  python scripts/bench_cpu_start.py prompt --model ~/SmolLM2         # a 1024-token prompt's first token: first use, second, third
  python scripts/bench_cpu_start.py prompt --model ~/SmolLM2 --tp 3  # the same over 3 virtual CPU devices (a worker thread each)
  python scripts/bench_cpu_start.py eager --model ~/SmolLM2          # enforce_eager: 16 greedy tokens of a short prompt, twice
  python scripts/bench_cpu_start.py serve --model ~/SmolLM2          # python -m tinyvllm.serve: /health, then the first answers, and
                                                                    # a new prompt's (the same one again hits the prefix cache)

`start` times what a user's `LLM()` costs after the import (run it twice against one CACHEDB: the first fills cache.db), then a
generate of one short prompt and one of a batch of two. `prompt` sends
the same 1024-token prompt three times (prefix caching off): the prompt-sized buckets' graphs are captured at their first use and
replayed after (before ea6fb98 a first call ran eagerly and the second captured). Run a tree against another with PYTHONPATH=<tree> and a CACHEDB of its own."""
import argparse, time
import numpy as np

if __name__ == "__main__":
  p = argparse.ArgumentParser()
  p.add_argument("what", choices=["start", "prompt", "eager", "serve"]); p.add_argument("--model"); p.add_argument("--tokens", type=int, default=1024)
  p.add_argument("--tp", type=int, default=1, help="tensor_parallel_size: CPU:0..tp-1, each device's kernels on its own worker thread")
  a = p.parse_args()
  if a.what == "serve":   # the server's start-up to /health, then the same request at once, again, and once the idle captures are done
    import json, os, subprocess, sys, urllib.request
    t, proc = time.perf_counter(), subprocess.Popen([sys.executable, "-m", "tinyvllm.serve", "--model", a.model, "--device", "CPU", "--port", "8017"],
                                                   stderr=subprocess.DEVNULL)
    def get(path, body=None):
      req = urllib.request.Request(f"http://127.0.0.1:8017{path}", json.dumps(body).encode() if body else None, {"Content-Type": "application/json"})
      return urllib.request.urlopen(req, timeout=600).read()
    while True:
      try: get("/health"); break
      except Exception: time.sleep(0.1)
    print(f"/health after {time.perf_counter() - t:.1f} s", flush=True)
    body = {"model": os.path.basename(a.model.rstrip("/")), "messages": [{"role": "user", "content": "The capital of France is"}], "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    # the last one asks something else of the same length: the same prompt again finds its prefix cached, a new one does not
    new = {**body, "messages": [{"role": "user", "content": "The capital of Spain is"}]}
    for when, req in (("first, at /health", body), ("second, right after", body), ("after 60 s idle (graphs captured meanwhile)", body),
                      ("a new prompt of the same length, after", new)):
      if when.startswith("after"): time.sleep(60)
      t = time.perf_counter(); out = json.loads(get("/v1/chat/completions", req))
      print(f"answer {when}: {time.perf_counter() - t:.2f} s, {out['usage']['completion_tokens']} tokens, {out['usage']['prompt_tokens']} prompt tokens", flush=True)
    proc.terminate(); sys.exit(0)
  from tinyvllm import LLM, SamplingParams
  t = time.perf_counter()
  llm = LLM(a.model, device="CPU", enable_prefix_caching=a.what == "start", tensor_parallel_size=a.tp, enforce_eager=a.what == "eager")
  print(f"LLM() {time.perf_counter() - t:.1f} s", flush=True)
  # start: then one short prompt, then a batch of two (on the CPU, LLM() leaves the graphs of 2-32 rows for the first batch of several)
  for n in (1, 2) if a.what == "start" else ():
    t = time.perf_counter(); llm.generate(["The capital of France is"] * n, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    print(f"then {n} prompt(s), 16 tokens each: {time.perf_counter() - t:.1f} s", flush=True)
  # eager: every step schedules and lowers its kernels again (cache.db holds them compiled), the host time that graphs save
  for use in ("first", "second") if a.what == "eager" else ():
    t = time.perf_counter(); llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    print(f"eager, {use} use: 16 tokens in {time.perf_counter() - t:.1f} s", flush=True)
  if a.what == "prompt":
    prompt = np.random.default_rng(0).integers(100, 40000, a.tokens).tolist()
    for use in ("first", "second", "third"):
      t = time.perf_counter(); llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
      print(f"{a.tokens}-token prompt, {use} use: {time.perf_counter() - t:.1f} s to its first token", flush=True)
    t = time.perf_counter(); out = llm.generate([prompt[:16]], SamplingParams(temperature=0, max_tokens=64, ignore_eos=True), use_tqdm=False)
    print(f"decode: {len(out[0].outputs[0].token_ids) / (time.perf_counter() - t):.1f} tok/s (64 tokens after a 16-token prompt)", flush=True)
