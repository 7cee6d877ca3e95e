"""--device / $DEVICE map onto tinygrad's DEV; an unusable device fails with a message listing what tinygrad can open."""
import os, subprocess, sys

def run(code, **env):
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, timeout=120)

def test_device_env_and_flag_select_tinygrad_device():
  assert run("from tinyvllm.config import select_device; print(select_device(None))", DEVICE="CPU").stdout.strip() == "CPU"
  assert run("from tinyvllm.config import select_device; from tinygrad import Tensor; select_device('CPU'); print(Tensor([1]).device)").stdout.strip() == "CPU"

def test_unknown_device_lists_what_tinygrad_found():
  r = run("from tinyvllm import LLM; LLM(device='NOPE')")
  assert r.returncode != 0 and "device 'NOPE' is not usable" in r.stderr and "tinygrad found: [" in r.stderr and "'CPU'" in r.stderr
