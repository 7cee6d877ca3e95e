#!/usr/bin/env python3
"""model.load_weights alone, on a real safetensors checkpoint (bench.py's dummy weights never read one), in this fresh process:

  python scripts/bench_load.py --model ~/SmolLM2 --device CPU                  # a checkpoint folder
  python scripts/bench_load.py --config llama-3.2-1b --device CUDA --dir /tmp/ckpt   # a random checkpoint of that shape, saved by
                                                                                     # transformers in bfloat16 into --dir if not there

Prints the seconds of the load (its wall and this process's CPU time) and of a realize of every weight's sum (all of them read back);
--digest adds an md5 of every weight's bytes, to compare two trees' loads bit for bit.
Run a tree against another with PYTHONPATH=<tree>; start-up caches play no part (no engine is made)."""
import argparse, os, shutil, sys, time

if __name__ == "__main__":
  p = argparse.ArgumentParser()
  p.add_argument("--model"); p.add_argument("--config"); p.add_argument("--dir", default="/tmp/bench_load"); p.add_argument("--device", default="CPU")
  p.add_argument("--digest", action="store_true", help="also an md5 of every weight's bytes, by name: two trees' loads compared exactly")
  a = p.parse_args()
  folder = a.model
  if folder is None:
    folder = os.path.join(a.dir, a.config)
    if not os.path.exists(os.path.join(folder, "model.safetensors")):
      import torch, transformers
      cfg = transformers.AutoConfig.from_pretrained(os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", a.config))
      transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).save_pretrained(folder, max_shard_size="100GB")
  from tinyvllm.config import select_device
  select_device(a.device)
  from tinygrad import Tensor, Device, dtypes
  from tinyvllm import model
  hf = model.read_config(folder)
  dtype = dtypes.float32 if Device.DEFAULT == "CPU" else dtypes.bfloat16 if hf.get("torch_dtype", hf.get("dtype")) == "bfloat16" else dtypes.float16
  t, c = time.perf_counter(), time.process_time()
  weights = model.load_weights(folder, hf, dtype)
  Device[Device.DEFAULT].synchronize()
  print(f"{model.__file__}: {len(weights)} weights loaded in {time.perf_counter() - t:.2f} s (CPU {time.process_time() - c:.2f} s)", flush=True)
  t = time.perf_counter()
  total = sum(w.float().sum().item() for w in weights.values())
  print(f"read back (sum {total:.6g}) in {time.perf_counter() - t:.2f} s")
  if a.digest:
    import hashlib
    h = hashlib.md5()
    for k in sorted(weights):
      h.update(k.encode() + str(weights[k].dtype).encode())
      h.update(weights[k].contiguous().bitcast(dtypes.uint8).numpy().tobytes())
    print(f"digest {h.hexdigest()} of {len(weights)} weights ({dtype})")
