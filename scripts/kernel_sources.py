#!/usr/bin/env python3
"""Every kernel source of a one-layer engine, rendered and compiled for a GPU on the NULL device (nothing executes), one hash a line:
a change that must leave the kernels alone is checked without a GPU by running this on two trees and diffing the output.

  LD_LIBRARY_PATH=<nvidia/cuda_nvrtc/lib> DEV=NULL:CUDA:sm_90 NULL_ALLOW_COPYOUT=1 PYTHONPATH=<tree> \\
    python scripts/kernel_sources.py llama-3.2-1b bfloat16 > a.txt          # then the other tree into b.txt; diff a.txt b.txt

The run is tests/test_renderers.py's (a 1024-token prompt and a greedy decode step, an 8-token prompt and a decode step through the
filtering sampler); nvrtc for CUDA comes from PyPI's nvidia-cuda-nvrtc-cu12."""
import hashlib, json, os, shutil, sys, tempfile

if __name__ == "__main__":
  model, dtype = sys.argv[1], sys.argv[2]
  import tinygrad.engine.realize as realize
  from tinygrad import Tensor
  to_program, seen = realize.to_program, {}
  def recorded(ast, ren):
    prg = to_program(ast, ren)
    # the PROGRAM's SOURCE: the kernel's code as the compiler gets it
    seen.setdefault(f"{prg.arg.function_name} {hashlib.sha256(prg.src[2].arg.encode()).hexdigest()[:16]}", None)
    return prg
  realize.to_program = recorded
  # dummy weights need no random kernels where nothing executes
  Tensor.uniform = lambda *shape, low=0, high=1, **kwargs: Tensor.empty(*shape, **kwargs)
  from tinyvllm.config import BUNDLED_MODEL
  from tinyvllm import LLM, SamplingParams
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  config = json.load(open(os.path.join(root, "scripts", "configs", model, "config.json")))
  config = {k: v for k, v in config.items() if k not in ("bos_token_id", "eos_token_id")} | {"num_hidden_layers": 1}
  os.makedirs(folder := os.path.join(tempfile.mkdtemp(), model))
  json.dump(config, open(os.path.join(folder, "config.json"), "w"))
  for f in ("tokenizer.json", "tokenizer_config.json"): shutil.copy(os.path.join(BUNDLED_MODEL, f), folder)
  llm = LLM(folder, load_format="dummy", dtype=dtype, enforce_eager=True, max_model_len=1280, max_num_seqs=4, max_num_batched_tokens=1024,
            kv_cache_memory=0.05)
  llm.generate([list(range(1, 1025))], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True), use_tqdm=False)
  llm.generate([list(range(1, 9))], SamplingParams(max_tokens=2, temperature=0.8, top_k=20, top_p=0.9, ignore_eos=True), use_tqdm=False)
  for line in sorted(seen): print(line)
