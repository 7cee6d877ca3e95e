#!/usr/bin/env python3
"""Where an engine's start-up goes: each start runs in a fresh process against its own tinygrad cache.db, and prints the engine's own
phase lines (weights, KV pool, capture), tinygrad's share of the capture (wall seconds, not CPU: the kernels are lowered and compiled
in tinygrad's worker processes while the engine waits) and three times: until the engine is ready (it has the graphs of a decode and
of a small prefill chunk), the first token of a --prompt-tokens prompt sent right then (chunked to the graphs it has), and until every
other graph is captured too (the server does that in its idle time, one graph at a time; here back to back, after that request).

Starts, in this order, all against one new cache.db:
  cold    nothing cached and the shipped cache not applied: a model shape the shipped file does not hold
  fresh   a new cache.db that the engine fills from the shipped file (on an sm_90 GPU): a fresh machine after `pip install`
  warm    the cache.db the fresh start left: a second start on that machine

  python scripts/profile_startup.py --config llama-3.2-1b --device CUDA --kv-cache-memory 40    # the throughput engine of BENCHMARKS.md
  python scripts/profile_startup.py --config llama-3.2-1b --device CUDA --kv-cache-memory 40 --max-num-seqs 1 --max-num-batched-tokens 1024 --beam 2
  python scripts/profile_startup.py --device CPU --max-num-seqs 64 --max-num-batched-tokens 512 --starts cold warm   # bundled model, Config defaults
"""
import argparse, collections, functools, json, os, subprocess, sys, tempfile, time
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # runs from a checkout without `pip install -e .`

def timed(owner, name:str, label:str, totals:dict, counts:collections.Counter):
  """Wrap owner.name so its wall time (outermost calls only) adds up under label."""
  fn, depth = getattr(owner, name), [0]
  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    if depth[0]: return fn(*args, **kwargs)
    depth[0], start = 1, time.perf_counter()
    try: return fn(*args, **kwargs)
    finally: depth[0], totals[label], counts[label] = 0, totals[label] + time.perf_counter() - start, counts[label] + 1
  setattr(owner, name, wrapper)

def child(args):
  start = time.perf_counter()
  import logging
  logging.basicConfig(level=logging.INFO, format="  log %(relativeCreated)7.0f ms  %(message)s", stream=sys.stdout)
  import tinygrad.engine.realize as realize, tinygrad.engine.jit as jit, tinygrad.schedule as schedule, tinygrad.schedule.rangeify as rangeify
  import tinygrad.helpers as helpers, tinygrad.tensor as tensor
  from tinyvllm.config import select_device
  select_device(args.device)   # first, as LLMEngine selects it before it builds anything
  import tinyvllm.model_runner as model_runner, tinyvllm.model as model
  from tinyvllm.llm_engine import LLMEngine
  from tinyvllm.config import Config
  if args.no_shipped:   # the engine applies an empty file instead of the shipped one
    with open(empty := os.path.join(tempfile.mkdtemp(), "empty.sql.xz"), "wb") as f: f.write(__import__("lzma").compress(b""))
    model_runner.SHIPPED_CACHE = empty
  totals, counts = collections.defaultdict(float), collections.Counter()
  # the names the callers use are rebound too, where they imported them
  for owner, name, label in [(rangeify, "get_kernel_graph", "schedule: new schedules (get_kernel_graph)"),
                             (schedule, "create_linear_with_vars", "schedule: all realizes (create_linear_with_vars)"),
                             (realize, "lower_and_compile", "lower + compile kernels (lower_and_compile, waits on workers)"),
                             (jit, "jit_lower", "jit_lower (memory plan, lower + compile, graph split)"),
                             (jit.CapturedJit, "__call__", "first run of each captured graph"),
                             (model_runner.ModelRunner, "forward", "building the model graphs (Python)"),
                             (model_runner.ModelRunner, "sample", "building the sampler graphs (Python)"),
                             (helpers, "diskcache_get", "cache.db reads (stored caches, binaries)"),
                             (helpers, "diskcache_put", "cache.db writes (stored caches, binaries)"),
                             (model, "load_weights", "load_weights"),
                             (model_runner.ModelRunner, "capture_next", "capture_next (a bucket's model graph, a sampler variant)")]:
    timed(owner, name, label, totals, counts)
  schedule.get_kernel_graph, tensor.create_linear_with_vars = rangeify.get_kernel_graph, schedule.create_linear_with_vars
  realize.compile_linear.__globals__["lower_and_compile"] = realize.lower_and_compile
  # (model_runner calls model.load_weights through its module, so the timed one)
  model_runner.diskcache_get, model_runner.diskcache_put = helpers.diskcache_get, helpers.diskcache_put
  imported = time.perf_counter()
  engine = LLMEngine(Config(model=args.model, device=args.device, load_format=args.load_format, **json.loads(args.engine)))
  ready, at_ready = time.perf_counter(), len(engine.runner.graphs)
  from tinyvllm.sequence import SamplingParams   # then a long prompt (what fits the context), its first token back
  prompt = [3 + i * 7 % (engine.runner.hf_config["vocab_size"] - 3) for i in range(min(args.prompt_tokens, engine.config.max_model_len - 1))]
  engine.add_request(prompt, SamplingParams(max_tokens=1))
  while not engine.step(): pass
  first_token = time.perf_counter() - ready
  while engine.runner.pending: engine.runner.capture_next()
  captured = time.perf_counter()
  print(f"  imports {imported - start:.1f} s")
  for label, seconds in totals.items(): print(f"  {seconds:7.1f} s  {counts[label]:5d} calls  {label}")
  print(f"  ready after {ready - start:.1f} s with {at_ready} step graphs (the process started at 0); first token of a {len(prompt)}-token "
        f"prompt {first_token * 1000:.0f} ms later; all {len(engine.runner.graphs)} step graphs after {captured - start:.1f} s")
  print("RESULT " + json.dumps({"ready_s": round(ready - start, 2), "graphs": len(engine.runner.graphs), "first_token_s": round(first_token, 3),
                               "prompt_tokens": len(prompt), "all_graphs_s": round(captured - start, 2)}))

def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", help="a scripts/configs folder name, e.g. llama-3.2-1b: dummy weights (default: the bundled model)")
  p.add_argument("--device")
  p.add_argument("--starts", nargs="+", default=["cold", "fresh", "warm"], choices=["cold", "fresh", "warm"])
  p.add_argument("--cache-db", help="the cache.db to start from (default: a new one, removed at the end)")
  for flag in ("--max-num-seqs", "--max-num-batched-tokens", "--beam", "--max-model-len"): p.add_argument(flag, type=int)
  p.add_argument("--kv-cache-memory", type=float)
  p.add_argument("--prompt-tokens", type=int, default=1024, help="the prompt sent at ready (cut to the context: the bundled model has 512)")
  p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--no-shipped", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--model", help=argparse.SUPPRESS)
  p.add_argument("--load-format", default="auto", help=argparse.SUPPRESS)
  p.add_argument("--engine", default="{}", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.child: return child(args)
  import bench   # scripts/bench.py: a model folder with a tokenizer beside the config's config.json
  model, load_format = bench.model_folder(argparse.Namespace(config=args.config, model=None))
  engine = {k: v for k in ("max_num_seqs", "max_num_batched_tokens", "beam", "max_model_len", "kv_cache_memory") if (v := getattr(args, k)) is not None}
  work = tempfile.mkdtemp(prefix="tinyvllm-startup-")
  cache_db, results = args.cache_db or os.path.join(work, "cache.db"), {}
  for run in args.starts:
    if run in ("cold", "fresh") and not args.cache_db:   # a new cache.db each
      for suffix in ("", "-wal", "-shm"):
        if os.path.exists(cache_db + suffix): os.remove(cache_db + suffix)
    shipped = "not applied" if run == "cold" else "applied if the GPU is sm_90"
    print(f"\n## {run} start (shipped cache {shipped}; cache.db {cache_db}), engine {engine}", flush=True)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--load-format", load_format, "--engine", json.dumps(engine),
           "--prompt-tokens", str(args.prompt_tokens)]
    cmd += (["--model", model] if model else []) + (["--device", args.device] if args.device else []) + (["--no-shipped"] if run == "cold" else [])
    out = subprocess.run(cmd, env={**os.environ, "CACHEDB": cache_db}, capture_output=True, text=True)   # stderr: progress bars
    print("\n".join(line for line in out.stdout.splitlines() if not line.startswith("RESULT ")), flush=True)
    if out.returncode: sys.exit(f"{out.stderr[-4000:]}\nthe {run} start failed (exit {out.returncode})")
    results[run] = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])
  print("\nSUMMARY " + ", ".join(f"{run}: ready {r['ready_s']:.1f} s, first token of {r['prompt_tokens']} prompt tokens +{r['first_token_s'] * 1000:.0f} ms, "
                                 f"all graphs {r['all_graphs_s']:.1f} s" for run, r in results.items()) + f" ({next(iter(results.values()))['graphs']} step graphs)")
  if args.config: __import__("shutil").rmtree(os.path.dirname(model), ignore_errors=True)
  if not args.cache_db: __import__("shutil").rmtree(work, ignore_errors=True)

if __name__ == "__main__": main()
