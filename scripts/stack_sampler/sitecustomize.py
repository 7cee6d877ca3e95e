"""A sampling profiler for a server started by another script (issue #70's /health gap): put this folder on PYTHONPATH, and every process
whose command line holds `tinyvllm.serve` writes every thread's innermost 10 frames every 20 ms, on the log's clock, to
$OUT/stacks-<pid>.txt (SAMPLE_ALL=1: every process). Python imports sitecustomize at start-up, before the script runs:

  PYTHONPATH=scripts/stack_sampler:. python scripts/bench_serving.py --launch --config llama-3.2-1b --device CUDA --health-only"""
import datetime, os, sys, threading, time, traceback

def sample():
  out, me = open(os.path.join(os.environ.get("OUT", "/tmp"), f"stacks-{os.getpid()}.txt"), "w"), threading.get_ident()
  while True:
    time.sleep(0.02)
    now, names = datetime.datetime.now().strftime("%H:%M:%S,%f")[:-3], {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
      if ident == me: continue
      frames = reversed(traceback.extract_stack(frame)[-10:])
      out.write(f"{now} {names.get(ident, ident)} | " + " < ".join(f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}" for f in frames) + "\n")
    out.flush()

if "tinyvllm.serve" in " ".join(sys.orig_argv) or os.environ.get("SAMPLE_ALL"): threading.Thread(target=sample, daemon=True).start()
