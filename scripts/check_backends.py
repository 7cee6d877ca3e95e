#!/usr/bin/env python3
"""Greedy tokens of one engine on one tinygrad backend, as a JSON line, to compare backends (issue #69): the bundled model against the
transformers reference recorded in tests/data/reference.json, or a scripts/configs shape on a fixed prompt, with random weights that numpy
draws from seed 0 and writes as float16 safetensors (the engine's own dummy weights differ between backends: tinygrad draws them per
device).

  python scripts/check_backends.py --device CUDA                                  # bundled model, its reference case
  python scripts/check_backends.py --device CL --config llama-3.2-1b --dtype float16 --tokens 32
  python scripts/check_backends.py --device PYTHON::METAL --tokens 2 --enforce-eager   # its first 2 tokens, emulated: slow
  python scripts/check_backends.py --device CL --dense --enforce-eager             # the dense in-step attention against transformers
--dense: a random 2-layer Llama (head_dim 64, 4 heads, 2 KV heads; weights drawn wide enough that greedy tokens vary) that transformers
saves and decodes greedily by hand; two prompts of 701 and 601 tokens share the first 1024-token step, so the dense in-step attention runs
with two sequences in it (the block-diagonal mask), then the second's rest and the decodes. For attention changes on a backend with
has_local (CL on pocl, a CPU OpenCL, runs it in minutes on 2 cores).
On NVIDIA's OpenCL (the GPU machine lists pocl first): mkdir -p icd && echo libnvidia-opencl.so.1 > icd/nvidia.icd && export OCL_ICD_VENDORS=$PWD/icd"""
import argparse, json, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__":
  p = argparse.ArgumentParser()
  p.add_argument("--device"); p.add_argument("--config"); p.add_argument("--dtype", default="auto")
  p.add_argument("--tokens", type=int, help="greedy tokens to make (default: 32; the bundled model's reference: its 40, or its first N)")
  p.add_argument("--enforce-eager", action="store_true")
  p.add_argument("--dense", action="store_true", help="a random small Llama through the dense in-step attention, against transformers")
  a = p.parse_args()
  from tinyvllm import LLM, SamplingParams
  t = time.perf_counter()
  if a.dense:
    import shutil, tempfile, torch, transformers
    from tinyvllm.config import BUNDLED_MODEL
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True, initializer_range=0.25,
                                   architectures=["LlamaForCausalLM"])
    hf = transformers.AutoModelForCausalLM.from_config(cfg)
    hf.save_pretrained(path := tempfile.mkdtemp(prefix="tinyvllm-dense-"))
    for f in ("tokenizer.json", "tokenizer_config.json"): shutil.copy(os.path.join(BUNDLED_MODEL, f), path)
    a.tokens = a.tokens or 8
    prompts, expected = [[1] + [(i * 37) % 500 + 3 for i in range(700)], [1] + [(i * 11) % 500 + 3 for i in range(600)]], []
    with torch.no_grad():   # greedy decoding by hand: every step's argmax of transformers' logits
      for prompt in prompts:
        ids = list(prompt)
        for _ in range(a.tokens): ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
        expected.append(ids[len(prompt):])
    t = time.perf_counter()
    llm = LLM(path, device=a.device, dtype=a.dtype, enforce_eager=a.enforce_eager, max_num_seqs=2, max_num_batched_tokens=1024,
              max_model_len=2048, kv_cache_memory=0.2)
  elif a.config:
    from scripts.bench import model_folder
    a.model, a.max_model_len = None, 2048
    import numpy as np
    from safetensors.numpy import save_file
    from tinyvllm.model import read_config, weight_shapes
    path, rng = model_folder(a)[0], np.random.default_rng(0)
    shapes = weight_shapes(read_config(path))
    save_file({k: (rng.random(s, np.float32) * 0.1 - 0.05).astype(np.float16) for k, s in shapes.items()}, f"{path}/model.safetensors")
    llm = LLM(path, device=a.device, dtype=a.dtype, max_num_seqs=4, max_model_len=2048, kv_cache_memory=2, enforce_eager=a.enforce_eager)
    a.tokens = a.tokens or 32
    # past DENSE_MIN: the dense in-step attention runs
    prompts, expected = [[128000] + [(i * 7919) % 120000 + 1000 for i in range(1030)]], None
  else:
    case = json.load(open(os.path.join(os.path.dirname(__file__), "..", "tests", "data", "reference.json")))["cases"][0]
    llm = LLM(device=a.device, dtype=a.dtype, enforce_eager=a.enforce_eager)
    # the first --tokens of the recorded ones, for the slow emulators
    a.tokens = a.tokens or case["num_new_tokens"]
    prompts, expected = [case["prompt_token_ids"]], [case["output_token_ids"][:a.tokens]]
  ready = time.perf_counter() - t
  greedy = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
  outs = [out.outputs[0].token_ids for out in llm.generate(prompts, greedy, use_tqdm=False)]
  print(json.dumps({"device": a.device, "config": "dense" if a.dense else a.config or "stories260K", "dtype": str(llm.engine.runner.dtype),
                    "ready_s": round(ready, 1), "tokens": outs if a.dense else outs[0],
                    "matches_reference": None if expected is None else outs == expected}), flush=True)
