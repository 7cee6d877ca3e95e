#!/usr/bin/env python3
"""N `python -m tinyvllm.serve` replicas behind vLLM's router (`pip install vllm-router`), started and stopped with one command.

Replica i listens on --base-port + i; with --gpus, replica i sees only the GPUs of the i-th entry (CUDA_VISIBLE_DEVICES, or --gpu-env).
Once every replica answers /health, `vllm-router` starts in front of them on --port. Unknown args go to every replica; --router-args to
the router (its own flags: `vllm-router --help`), after CACHE_AWARE's thresholds (the last of a flag wins). Ctrl-C or SIGTERM stops the
router, then the replicas (uvicorn's graceful shutdown).

  python scripts/serve_replicas.py --replicas 2 --device CPU                                  # the bundled model, two replicas
  python scripts/serve_replicas.py --gpus 0 1 --device CUDA --model DIR                      # one replica per GPU
  python scripts/serve_replicas.py --gpus 0,1 2,3 --device CUDA --model DIR --tensor-parallel-size 2   # 2 replicas of TP=2 on 4 GPUs
  python scripts/serve_replicas.py --gpus 0 1 --device CUDA --config llama-3.2-1b --policy round_robin
"""
import argparse, os, shlex, shutil, signal, subprocess, sys, time, types, urllib.request
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# cache_aware's thresholds, so that the replicas share the work (#61; the README's "Scale out" says why). With vllm-router's own (64, 1.5,
# 0.3) it balances only past 64 more requests in flight on one replica than on another: 64 chats through one chat template all went to one.
CACHE_AWARE = "--balance-abs-threshold 4 --balance-rel-threshold 1.2 --cache-threshold 0.5"

def healthy(url:str) -> bool:
  try: return urllib.request.urlopen(url + "/health", timeout=2).status == 200
  except OSError: return False

def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--replicas", type=int, help="number of replicas (default: one per --gpus entry, else 2)")
  p.add_argument("--gpus", nargs="+", metavar="IDS", help="per replica, the GPUs it sees, e.g. 0 1 or 0,1 2,3")
  p.add_argument("--gpu-env", default="CUDA_VISIBLE_DEVICES", help="the variable --gpus sets (e.g. HIP_VISIBLE_DEVICES)")
  p.add_argument("--host", default="127.0.0.1", help="address of the router and the replicas")
  p.add_argument("--port", type=int, default=8000, help="the router's port")
  p.add_argument("--base-port", type=int, default=8100, help="replica i listens on BASE_PORT + i")
  p.add_argument("--policy", default="cache_aware", help="vllm-router's --policy: cache_aware, power_of_two, round_robin, ...")
  p.add_argument("--router-args", default="", help="more vllm-router flags, one string, e.g. '--prometheus-port 29000'; "
                 f"with cache_aware they follow (and may override) {CACHE_AWARE}")
  p.add_argument("--config", help="serve a scripts/configs folder (e.g. llama-3.2-1b) with dummy weights, as bench_serving.py does")
  p.add_argument("--log-dir", help="write replica-I.log and router.log there instead of to this terminal")
  p.add_argument("--startup-timeout", type=float, default=1800, help="seconds for every replica to answer /health")
  args, serve_args = p.parse_known_args()
  n = args.replicas or (len(args.gpus) if args.gpus else 2)
  if args.gpus and len(args.gpus) != n: p.error(f"--gpus has {len(args.gpus)} entries for {n} replicas")
  if not (router_bin := shutil.which("vllm-router")): sys.exit("vllm-router is not installed: pip install vllm-router")
  if args.config:
    sys.path.insert(0, ROOT)
    from scripts.bench import model_folder
    serve_args += ["--model", model_folder(types.SimpleNamespace(config=args.config, model=None))[0], "--load-format", "dummy"]
  os.makedirs(args.log_dir, exist_ok=True) if args.log_dir else None
  log = lambda name: open(os.path.join(args.log_dir, name), "w") if args.log_dir else None
  procs, urls = [], [f"http://{args.host}:{args.base_port + i}" for i in range(n)]

  def stop(code=0):   # the router first, so no request goes to a replica that is going away; then the replicas, together
    for sig in (signal.SIGTERM, signal.SIGINT): signal.signal(sig, signal.SIG_IGN)
    for group in (procs[n:], procs[:n]):
      for proc in group: proc.poll() is None and proc.send_signal(signal.SIGTERM)
      for proc in group:
        try: proc.wait(30)
        except subprocess.TimeoutExpired: proc.kill(); proc.wait()
    sys.exit(code)
  for sig in (signal.SIGTERM, signal.SIGINT): signal.signal(sig, lambda *_: stop())

  # each child in its own session: a terminal's Ctrl-C reaches only this script, which stops them in order
  for i, url in enumerate(urls):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),   # this tree's tinyvllm
           **({args.gpu_env: args.gpus[i]} if args.gpus else {})}
    cmd = [sys.executable, "-m", "tinyvllm.serve", "--host", args.host, "--port", str(args.base_port + i), *serve_args]
    procs.append(subprocess.Popen(cmd, env=env, stdout=log(f"replica-{i}.log"), stderr=subprocess.STDOUT, start_new_session=True))
    print(f"replica {i}: pid {procs[-1].pid} {url}" + (f" {args.gpu_env}={args.gpus[i]}" if args.gpus else ""), flush=True)
  deadline = time.monotonic() + args.startup_timeout
  while not all(healthy(url) for url in urls):
    if dead := [i for i, proc in enumerate(procs) if proc.poll() is not None]: print(f"replica {dead} exited", flush=True); stop(1)
    if time.monotonic() > deadline: print(f"replicas not healthy after {args.startup_timeout} s", flush=True); stop(1)
    time.sleep(0.5)
  flags = [*(shlex.split(CACHE_AWARE) if args.policy == "cache_aware" else []), *shlex.split(args.router_args)]
  cmd = [router_bin, "--host", args.host, "--port", str(args.port), "--worker-urls", *urls, "--policy", args.policy, *flags]
  procs.append(subprocess.Popen(cmd, stdout=log("router.log"), stderr=subprocess.STDOUT, start_new_session=True))
  print(f"router: pid {procs[-1].pid} http://{args.host}:{args.port} ({' '.join([args.policy, *flags])})", flush=True)
  while not healthy(f"http://{args.host}:{args.port}"):
    if procs[-1].poll() is not None or time.monotonic() > deadline: print("the router did not start", flush=True); stop(1)
    time.sleep(0.2)
  print(f"ready on http://{args.host}:{args.port}", flush=True)
  while procs[-1].poll() is None: time.sleep(1)   # a replica may die: the router drains it and the others serve on
  print(f"the router exited with code {procs[-1].returncode}", flush=True); stop(1)

if __name__ == "__main__": main()
