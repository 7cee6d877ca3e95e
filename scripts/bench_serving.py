#!/usr/bin/env python3
"""Online serving benchmark for an OpenAI-compatible chat server (tinyvllm.serve, or vLLM for comparison).

--concurrency streaming chat clients send --num-prompts requests of random words, each with max_tokens=--output-len and ignore_eos, and
we report TTFT p50/p99, TPOT p50/p99 (per request: (e2e - ttft) / (tokens - 1)) and overall output tok/s. --warmup-rounds rounds of
--concurrency requests run first and are not counted (with --launch, tinyvllm is timed once every step graph is captured; other servers
may compile lazily). With --launch --from-ready SECONDS, requests at each --concurrency in turn, SECONDS each, are sent from the moment the
server is healthy, with no warm-up and no pause between levels, and reported apart ("from ready"): what users meet while the server still
captures graphs; then the same levels run once every graph is in (the server captures the rest in its first idle moments).

  python -m tinyvllm.serve --device CUDA --model DIR &  python scripts/bench_serving.py --url http://127.0.0.1:8000
  python scripts/bench_serving.py --launch --device CUDA --model DIR      # starts the server; unknown args are passed to it
  python scripts/bench_serving.py --launch --device CUDA --config llama-3.2-1b --kv-cache-memory 20   # dummy weights
  python scripts/bench_serving.py --launch --device CUDA --config llama-3.2-1b --from-ready 60 --concurrency 1 8 --output-len 256
Uses the official `openai` client when it is installed, else raw httpx SSE.
"""
import argparse, asyncio, datetime, json, os, random, re, subprocess, sys, threading, time, urllib.parse
import httpx, numpy as np
try: from openai import AsyncOpenAI
except ImportError: AsyncOpenAI = None

WORDS = ("the a little girl boy dog cat sun tree house park ball happy sad big small red blue green went saw played ran jumped found "
         "said mom dad friend day night sky water toy box cake bird fish car book door garden flower rain snow walk look smile help").split()

async def stream_openai(client, model:str, body:dict):
  """Yields (content delta or None, completion_tokens from the usage chunk or None) for one streaming chat request."""
  extra = {"ignore_eos": body.pop("ignore_eos")}
  async for c in await client.chat.completions.create(model=model, stream=True, extra_body=extra, **body):
    yield (c.choices[0].delta.content if c.choices else None), (c.usage.completion_tokens if c.usage else None)

async def stream_httpx(client, model:str, body:dict):
  async with client.stream("POST", "/v1/chat/completions", json={"model": model, "stream": True, **body}) as r:
    if r.status_code != 200: raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}")
    async for line in r.aiter_lines():
      if not line.startswith("data: ") or line == "data: [DONE]": continue
      if "error" in (obj := json.loads(line[6:])): raise RuntimeError(obj["error"].get("message"))
      yield (obj["choices"][0]["delta"].get("content") if obj.get("choices") else None), (obj.get("usage") or {}).get("completion_tokens")

async def one_request(stream, client, model:str, prompt:str, args) -> tuple[float, float, int]:
  """(ttft, e2e, output tokens) in seconds. The first token is the first chunk with text: the server opens with an empty role chunk."""
  body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": args.output_len, "temperature": args.temperature,
          "stream_options": {"include_usage": True}, "ignore_eos": True}
  t0, ttft, chunks, usage = time.perf_counter(), None, 0, None
  async for text, n in stream(client, model, body):
    if text:
      ttft, chunks = ttft or time.perf_counter() - t0, chunks + 1
    usage = n if n is not None else usage
  if ttft is None: raise RuntimeError("no text in the response")
  return ttft, time.perf_counter() - t0, usage or chunks   # chunks undercount if the server merges or holds back tokens; usage is exact

async def run(args, url:str, prompts:list[str], deadline:float|None=None) -> tuple[list, list, float]:
  """The requests at args.concurrency: after the warm-up rounds, all the rest; with a deadline, no warm-up, and none sent after it."""
  headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
  async with httpx.AsyncClient(base_url=url, headers=headers, timeout=None, limits=httpx.Limits(max_connections=args.concurrency + 4)) as hc:
    model = (await hc.get("/v1/models")).raise_for_status().json()["data"][0]["id"]
    if AsyncOpenAI is not None: stream, client = stream_openai, AsyncOpenAI(base_url=f"{url}/v1", api_key=args.api_key or "EMPTY",
                                                                            max_retries=0, timeout=None, http_client=hc)
    else: stream, client = stream_httpx, hc
    async def batch(todo:list[str]) -> tuple[list, list]:
      results, errors, queue = [], [], list(reversed(todo))
      async def worker():
        while queue and (deadline is None or time.perf_counter() < deadline):
          try: results.append(await one_request(stream, client, model, queue.pop(), args))
          except Exception as e: errors.append(f"{type(e).__name__}: {e}")
      await asyncio.gather(*(worker() for _ in range(args.concurrency)))
      return results, errors
    for i in range(args.warmup_rounds if deadline is None else 0):   # two alike rounds: TinyJit compiles a step size on its first call and captures it on the second
      if (errors := (await batch(prompts[i * args.concurrency:(i + 1) * args.concurrency]))[1]):
        print(f"warm-up: {len(errors)} failed, first: {errors[0]}")
    t = time.perf_counter()
    results, errors = await batch(prompts[args.warmup_rounds * args.concurrency:] if deadline is None else prompts)
    return results, errors, time.perf_counter() - t

def launch(args, server_args:list[str], url:str) -> tuple[subprocess.Popen, float, threading.Event]:
  """Starts the server and returns (its process, the time it started, an event set once it has every step graph) once it has every step
  graph, or with --from-ready once it is healthy: it serves once it has the graphs of a decode and of a small prefill chunk, and
  captures the others while idle."""
  u = urllib.parse.urlparse(url)
  cmd = [sys.executable, "-m", "tinyvllm.serve", "--host", u.hostname, "--port", str(u.port or 80), *server_args]
  cmd += ["--api-key", args.api_key] if args.api_key else []
  print("launching:", " ".join(cmd), flush=True)
  launched = datetime.datetime.now().strftime("%H:%M:%S,%f")[:-3]
  proc, t, healthy, captured = subprocess.Popen(cmd, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, text=True), time.perf_counter(), None, threading.Event()
  def echo():   # the server's log, passed through; its line for the last graph (or, eager, for no graph to capture) is what we wait for
    for line in proc.stdout:
      print(line, end="", flush=True)
      if re.search(r"all \d+ step graph units captured| 0 more to capture", line): captured.set()
  threading.Thread(target=echo, daemon=True).start()
  while time.perf_counter() - t < args.launch_timeout:   # start-up loads the model and captures the first graphs: a minute on a fresh GPU
    if proc.poll() is not None: sys.exit(f"server exited with code {proc.returncode} before it was ready")
    try:
      if healthy is None and httpx.get(f"{url}/health", timeout=2).status_code == 200:
        print(f"server healthy after {(healthy := time.perf_counter() - t):.1f} s (launched at {launched}, the log's clock)", flush=True)
    except httpx.TransportError: pass
    if healthy is not None and (args.from_ready or args.health_only): return proc, t, captured
    if healthy is not None and captured.wait(1): print(f"all step graphs captured after {time.perf_counter() - t:.1f} s", flush=True); return proc, t, captured
    if healthy is None: time.sleep(0.05)   # /health polled often: the launch-to-healthy figure is what #40 measures
  proc.terminate(); sys.exit(f"server not ready after {args.launch_timeout} s")

def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--url", default="http://127.0.0.1:8000")
  p.add_argument("--launch", action="store_true", help="start `python -m tinyvllm.serve` with the unknown args, and stop it at the end")
  p.add_argument("--launch-timeout", type=float, default=1800)
  p.add_argument("--config", help="with --launch: serve a scripts/configs folder (e.g. llama-3.2-1b) with dummy weights")
  p.add_argument("--num-prompts", type=int, help="counted requests at each concurrency (default: 4 rounds of it, at least 4)")
  p.add_argument("--concurrency", type=int, nargs="+", default=[16], help="one or more: each is measured in turn against the same server")
  p.add_argument("--input-words", type=int, default=100, help="random words per prompt")
  p.add_argument("--output-len", type=int, default=128)
  p.add_argument("--temperature", type=float, default=0.6)
  p.add_argument("--warmup-rounds", type=int, default=2, help="uncounted rounds of --concurrency requests first")
  p.add_argument("--api-key")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--from-ready", type=float, metavar="SECONDS", help="with --launch: first, requests at each --concurrency in turn from the "
                 "moment the server is healthy, SECONDS each, reported apart")
  p.add_argument("--health-only", action="store_true", help="with --launch: time the server's /health, then stop it")
  args, server_args = p.parse_known_args()
  if server_args and not args.launch: p.error(f"unrecognized arguments: {' '.join(server_args)} (server args need --launch)")
  url, rng, levels = args.url.rstrip("/"), random.Random(args.seed), [] if args.health_only else args.concurrency
  if args.config:   # the same dummy-weight model folder as bench.py, tokenizer included
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from scripts.bench import model_folder
    server_args += ["--model", model_folder(args)[0], "--load-format", "dummy"]
  if args.from_ready and not args.launch: p.error("--from-ready needs --launch")
  words = lambda n: [" ".join(rng.choice(WORDS) for _ in range(args.input_words)) for _ in range(n)]
  # made before the server starts: making them takes seconds, which a server would spend as idle time (capturing graphs)
  from_ready_prompts = words(10_000) if args.from_ready else []
  proc, started, captured = launch(args, server_args, url) if args.launch else (None, None, None)
  try:
    # as users meet it: from /health on, each level in turn for SECONDS with no pause between them, while the server still captures graphs
    for i, args.concurrency in enumerate(levels if args.from_ready else []):
      print(f"from ready: concurrency {args.concurrency} for {args.from_ready:.0f} s", flush=True)
      report(args, *asyncio.run(run(args, url, from_ready_prompts[i::len(levels)], time.perf_counter() + args.from_ready)), "from ready")
    if args.from_ready:
      if not captured.wait(args.launch_timeout): sys.exit("not every step graph was captured")
      print(f"all step graphs captured after {time.perf_counter() - started:.1f} s", flush=True)
    for args.concurrency in levels:
      num_prompts = args.num_prompts or max(4, 4 * args.concurrency)
      report(args, *asyncio.run(run(args, url, words(args.warmup_rounds * args.concurrency + num_prompts))))
  finally:
    if proc: proc.terminate(); proc.wait(30)

def report(args, results, errors, wall, label="serving"):
  print(f"client: {'openai' if AsyncOpenAI else 'httpx'}; {len(results)} ok, {len(errors)} failed" + (f", first: {errors[0]}" if errors else ""))
  if not results: sys.exit(1)
  ttft, e2e, ntok = map(np.array, zip(*results))
  tpot = [(e - t) / (n - 1) for t, e, n in results if n > 1] or [float("nan")]
  pct = lambda x, q: np.percentile(x, q) * 1e3
  print(f"{len(results)} requests, concurrency {args.concurrency}, ~{args.input_words} words in, {args.output_len} tokens out: {wall:.2f} s, "
        f"{ntok.sum()} output tokens, {ntok.sum() / wall:.1f} output tok/s, {len(results) / wall:.2f} req/s")
  print(f"TTFT ms: mean {ttft.mean() * 1e3:.1f}, p50 {pct(ttft, 50):.1f}, p99 {pct(ttft, 99):.1f}")
  print(f"TPOT ms: mean {np.mean(tpot) * 1e3:.2f}, p50 {pct(tpot, 50):.2f}, p99 {pct(tpot, 99):.2f}")
  print(f"SUMMARY | {label} | {len(results)} reqs, concurrency {args.concurrency}, out {args.output_len} | TTFT p50 {pct(ttft, 50):.1f} ms, "
        f"p99 {pct(ttft, 99):.1f} ms | TPOT p50 {pct(tpot, 50):.2f} ms, p99 {pct(tpot, 99):.2f} ms | {ntok.sum() / wall:.1f} out tok/s |", flush=True)

if __name__ == "__main__": main()
