#!/usr/bin/env python3
"""Offline benchmarks of the tinyvllm engine.

Throughput, nano-vllm's workload: --num-requests prompts of uniform random token ids with uniform random input and output lengths,
ignore_eos, all handed to LLM.generate at once (continuous batching), or one at a time with --sequential (the baseline).
Latency (--latency): batch-1 decode tok/s after a 128-token prompt and time to first token of a 1024-token prompt, each printed beside a
roofline from the device copy bandwidth and matmul rate measured in the same run.

  python scripts/bench.py                                             # bundled stories260K, real weights, default device
  python scripts/bench.py --config llama-3.2-1b --device CUDA         # scripts/configs/llama-3.2-1b, dummy weights
  python scripts/bench.py --config llama-3.2-1b --device CUDA --latency

Peers in the same run (--peer hf, scripts/bench_peer.py): Hugging Face transformers on the same requests, weights shape and device (its
continuous batching for throughput; static cache + torch.compile for latency), run after ours, once our memory is handed back, in a child
process (bench.py --peer-only); it prints its own SUMMARY lines and a RATIO line per figure (tinyvllm's speed / the peer's).

  python scripts/bench.py --config llama-3.2-1b --device CUDA --kv-cache-memory 40 --peer hf
  python scripts/bench.py --config llama-3.2-1b --device CUDA --kv-cache-memory 40 --latency --max-num-seqs 1 --max-num-batched-tokens 1024 --peer hf

--peer tinygrad (with --latency) runs tinygrad.llm, tinygrad's own single-stream engine, on the same weights shape (random, float16).
"""
import argparse, gc, json, math, os, shutil, statistics, subprocess, sys, tempfile, time
import numpy as np
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # runs from a checkout without `pip install -e .`
from tinygrad import Tensor, TinyJit, Device, dtypes
from tinyvllm import LLM, SamplingParams
from tinyvllm.config import BUNDLED_MODEL, select_device

ENGINE_ARGS = ("max_num_seqs", "max_num_batched_tokens", "kv_cache_memory", "block_size", "enforce_eager", "max_model_len", "dtype", "beam",
               "tensor_parallel_size")

def model_folder(args) -> tuple[str | None, str]:
  """(model folder, load_format) for the engine."""
  if not args.config: return args.model, "auto"
  # scripts/configs/<name> holds only config.json: dummy weights (load_format="dummy") and no tokenizer. LLMEngine always builds
  # Tokenizer(model_dir), so run from a temp copy with a tokenizer.json beside the config: Llama 3's 128k BPE for the large vocabularies
  # (so the server benchmark streams real text; ids past its 128,256 decode to ""), made with transformers from Meta's ranks file in
  # tests/data as tests/conftest.py makes it (~10 s), and stories260K's for small ones or without transformers.
  # The config's own BOS/EOS ids are dropped from the copy, so the stand-in's count: Qwen's EOS 151645 lies past Llama 3's vocabulary, and
  # llguidance refuses a tokenizer whose EOS it does not hold (the benchmarks ignore EOS anyway).
  os.makedirs(dst := os.path.join(tempfile.mkdtemp(prefix="tinyvllm-bench-"), args.config))
  config = json.load(open(os.path.join(HERE, "configs", args.config, "config.json")))
  with open(os.path.join(dst, "config.json"), "w") as f: json.dump({k: v for k, v in config.items() if k not in ("bos_token_id", "eos_token_id")}, f)
  llama3 = os.path.join(os.path.dirname(HERE), "tests", "data", "llama3-tiktoken")
  if config["vocab_size"] >= 128256 and os.path.isdir(llama3):
    try:
      from transformers import AutoTokenizer
      AutoTokenizer.from_pretrained(llama3, add_bos_token=True).save_pretrained(dst)
      return dst, "dummy"
    except ImportError: print("no transformers to make Llama 3's tokenizer.json: stories260K's tokenizer stands in (ids past 512 decode to '')")
  for f in ("tokenizer.json", "tokenizer_config.json"): shutil.copy(os.path.join(BUNDLED_MODEL, f), dst)
  return dst, "dummy"

def best_time(fn, *args, reps=5, inner=10) -> float:
  """Best seconds per call of a TinyJit'd fn: calls 1-2 compile and capture; each timed rep replays `inner` times between syncs, so
  the host's launch overhead overlaps the device work."""
  for _ in range(2): fn(*args)
  best = math.inf
  for _ in range(reps):
    Device[Device.DEFAULT].synchronize(); t = time.perf_counter()
    for _ in range(inner): fn(*args)
    Device[Device.DEFAULT].synchronize(); best = min(best, (time.perf_counter() - t) / inner)
  return best

def measure_device(copy_gib:float, mm:int, dtype) -> tuple[float, float]:
  """(copy bandwidth B/s counting bytes read + written, matmul FLOP/s) on the default device: the hardware ceilings, so through the vendor
  library (torch's cudaMemcpy and cuBLAS) where it is there, else through tinygrad's own kernels."""
  try:
    import torch
    assert Device.DEFAULT == "CUDA" and torch.cuda.is_available()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    def best(fn, reps=10):   # best of 3 event-timed runs of `reps` calls, after one warm-up call
      fn(); times = []
      for _ in range(3):
        ev[0].record(); [fn() for _ in range(reps)]; ev[1].record(); torch.cuda.synchronize(); times.append(ev[0].elapsed_time(ev[1]) / 1e3 / reps)
      return min(times)
    def copy_bw(n:int) -> float: a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a); return 2 * n / best(lambda: b.copy_(a))
    def mm_rate(n:int) -> float: x = torch.randn(n, n, dtype=torch.float16, device="cuda"); return 2 * n**3 / best(lambda: x @ x)
    bw, rate = copy_bw(int(copy_gib * 2**30)), mm_rate(mm)
    torch.cuda.empty_cache()   # the buffers died with the helpers: hand the memory back before the KV pool sizes itself
    return bw, rate
  except (ImportError, AssertionError): pass
  a = Tensor.zeros(int(copy_gib * 2**30) // 4, dtype=dtypes.float32).contiguous().realize()
  bw = 2 * a.nbytes() / best_time(TinyJit(lambda x: (x + 1).realize()), a)    # one elementwise kernel: reads a, writes a new buffer
  x, y = Tensor.rand(mm, mm, dtype=dtype).realize(), Tensor.rand(mm, mm, dtype=dtype).realize()
  rate = 2 * mm**3 / best_time(TinyJit(lambda p, q: (p @ q).realize()), x, y, inner=3)
  del a, x, y
  if hasattr(alloc := Device[Device.DEFAULT].allocator, "free_cache"): alloc.free_cache()   # give the memory back before the KV pool sizes
  return bw, rate

def timed_request(eng, ids:list[int], sp:SamplingParams) -> list[float]:
  """Runs one request alone through the engine; returns the seconds from submission to each output token."""
  t0, times = time.perf_counter(), []
  eng.add_request(ids, sp)
  while eng.has_unfinished():
    for out in eng.step(): times += [time.perf_counter() - t0] * sum(len(o.token_ids) for o in out.outputs)
  return times

def latency(args, llm, name, dev, bw, rate):
  eng, runner, rng = llm.engine, llm.engine.runner, np.random.default_rng(args.seed)
  c, it, mml, vocab = runner.hf_config, runner.dtype.itemsize, eng.config.max_model_len, min(runner.hf_config["vocab_size"], 10000)
  w, L, H, KV, hd = runner.model.w, c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
  params = sum(t.numel() for t in w.values())
  # decode reads every weight once per token, except the embedding table (one row gathered), plus the whole LM head (tied or not)
  weight_bytes = (params - w["model.embed_tokens.weight"].numel() + runner.model.lm_head.numel()) * it
  # MoE: a token goes through k of the E experts in each sparse layer, so decode reads (and prefill computes) only those: the active
  # parameters (Qwen3-30B-A3B: 3.3 B of 30.5 B). A 1024-token prefill still reads every expert.
  experts = sum(t.numel() for k, t in w.items() if ".experts." in k)
  inactive = experts * (1 - c["num_experts_per_tok"] / c["num_experts"]) if experts else 0
  prompt, out, T = latency_lengths(mml)
  sp = SamplingParams(temperature=args.temperature, max_tokens=out, ignore_eos=True)
  runs = [timed_request(eng, rng.integers(0, vocab, prompt).tolist(), sp) for _ in range(5)][2:]   # 2 warm-up runs (JIT capture)
  dec = statistics.median((len(t) - 1) / (t[-1] - t[0]) for t in runs)
  kv_bytes = 2 * L * KV * hd * it * (prompt + out / 2)    # K and V of the average context, every layer
  # tensor parallel: the roofline of the GPUs' summed bandwidth (each reads its share of the split weights, and all of the copied ones)
  tp = eng.config.tensor_parallel_size
  dec_roof = bw * tp / (weight_bytes - inactive * it + kv_bytes)
  # fresh random prompts each run, so the prefix cache never hits
  ttft = statistics.median([timed_request(eng, rng.integers(0, vocab, T).tolist(), SamplingParams(max_tokens=1))[0] for _ in range(7)][2:])
  proj = sum(t.numel() for k, t in w.items() if k.endswith("_proj.weight")) + experts - inactive
  # prefill: 2 FLOPs per weight per token in the projections, the LM head for the last token only, causal attention (QK^T and PV)
  flops = 2 * T * proj + 2 * runner.model.lm_head.numel() + L * 2 * H * hd * T * (T + 1)
  ttft_roof = max(flops / rate / tp, weight_bytes / bw / tp)
  print(f"params {params / 1e6:,.1f} M ({runner.dtype.name}{f', {(params - inactive) / 1e6:,.1f} M active' if experts else ''}), "
        f"bytes read per decode token {(weight_bytes - inactive * it + kv_bytes) / 1e6:,.1f} MB, "
        f"prefill FLOPs for {T} tokens {flops / 1e9:,.1f} G")
  print(f"decode batch 1 ({prompt}-token prompt, {out} tokens): {dec:.1f} tok/s, roofline {dec_roof:.1f} tok/s ({dec / dec_roof:.1%})")
  # the GPU's side of it: the 1-token step's graphs (model and sampler, an empty batch) replayed back to back. The engine's decode rate
  # moved by several percent from one process to the next where this stayed within 0.3% (BENCHMARKS.md, "the padding tiles skipped")
  runner.prepare([], 1)[0]().tolist(); Device[Device.DEFAULT].synchronize(); t = time.perf_counter()
  for _ in range(200): last = runner.prepare([], 1)[0]()
  last.tolist(); print(f"decode step graphs replayed (1-token bucket, 200 times): {(time.perf_counter() - t) / 200 * 1e3:.3f} ms a step")
  print(f"TTFT {T}-token prompt: {ttft * 1e3:.1f} ms median of 5, roofline {ttft_roof * 1e3:.2f} ms ({ttft_roof / ttft:.1%})")
  print(f"SUMMARY | {name} | {dev} | decode batch 1 | {dec:.1f} tok/s | roofline {dec_roof:.0f} tok/s at {bw / 1e9:.0f} GB/s copy | "
        f"{dec / dec_roof:.1%} |")
  print(f"SUMMARY | {name} | {dev} | TTFT {T} tokens | {ttft * 1e3:.1f} ms | roofline {ttft_roof * 1e3:.2f} ms at {rate / 1e12:.3g} TFLOPS | "
        f"{ttft_roof / ttft:.1%} |")
  return dict(dec=dec, ttft=ttft, dec_roof=dec_roof, ttft_roof=ttft_roof)

def workload(args, vocab:int, mml:int):
  """(input lengths, output lengths, prompts): --num-requests uniform random requests, seeded, so the peer gets the same ones."""
  rng, n = np.random.default_rng(args.seed), args.num_requests
  ins, outs = rng.integers(args.min_input, args.max_input + 1, n), rng.integers(args.min_output, args.max_output + 1, n)
  prompts = [rng.integers(0, min(vocab, 10000), k).tolist() for k in ins]
  if args.max_input + args.max_output > mml:   # e.g. stories260K's 512: keep every request inside the context
    ins, outs = np.minimum(ins, mml // 2), np.minimum(outs, mml - np.minimum(ins, mml // 2))
    prompts = [p[:k] for p, k in zip(prompts, ins)]
    print(f"note: lengths clipped to max_model_len {mml}: inputs {ins.min()}-{ins.max()}, outputs {outs.min()}-{outs.max()}")
  return ins, outs, prompts

def throughput_summary(name, dev, mode, ins, outs, dt, n_out) -> float:
  n, n_in = len(ins), int(sum(ins))
  print(f"SUMMARY | {name} | {dev} | {mode} {n} reqs, in {ins.min()}-{ins.max()}, out {outs.min()}-{outs.max()} | {dt:.1f} s | "
        f"{n_out / dt:.1f} out tok/s | {(n_in + n_out) / dt:.1f} total tok/s |")
  return n_out / dt

def throughput(args, llm, name, dev, ins, outs, prompts) -> float:
  eng, n = llm.engine, args.num_requests
  sps = [SamplingParams(temperature=args.temperature, max_tokens=int(k), ignore_eos=True) for k in outs]
  t = time.perf_counter()
  if args.sequential: res = [llm.generate([p], [sp], use_tqdm=False)[0] for p, sp in zip(prompts, sps)]
  else: res = llm.generate(prompts, sps, use_tqdm=sys.stderr.isatty())
  dt, n_out, n_in = time.perf_counter() - t, sum(len(r.outputs[0].token_ids) for r in res), int(sum(ins))
  mode = "sequential" if args.sequential else "batched"
  print(f"{mode}: {n} requests, {n_in} prompt + {n_out} output tokens in {dt:.2f} s: {n_out / dt:.1f} output tok/s, "
        f"{(n_in + n_out) / dt:.1f} total tok/s, {eng.scheduler.num_preemptions} preemptions")
  return throughput_summary(name, dev, mode, ins, outs, dt, n_out)

def latency_lengths(mml:int) -> tuple[int, int, int]:   # prompt and output of the batch-1 decode run, prompt of the TTFT run
  return min(128, mml // 2), min(128, mml // 2), min(1024, mml - 1)

def peer_latency_report(ours:dict, name:str, peer:str, dev:str, dec:float, ttft:float, T:int):
  """A peer's batch-1 SUMMARY lines against our rooflines, and with our figures (--peer-ours) a RATIO line each: tinyvllm / the peer."""
  roof = lambda text: text if ours else "roofline n/a | |"
  print(f"SUMMARY | {name} on {peer} | {dev} | decode batch 1 | {dec:.1f} tok/s | "
        + roof(ours and f"roofline {ours['dec_roof']:.0f} tok/s | {dec / ours['dec_roof']:.1%} |"))
  print(f"SUMMARY | {name} on {peer} | {dev} | TTFT {T} tokens | {ttft * 1e3:.1f} ms | "
        + roof(ours and f"roofline {ours['ttft_roof'] * 1e3:.2f} ms | {ours['ttft_roof'] / ttft:.1%} |"))
  if ours:
    print(f"RATIO | {name} | {dev} | decode batch 1 tok/s | tinyvllm / {peer} | {ours['dec'] / dec:.2f}x |")
    print(f"RATIO | {name} | {dev} | TTFT {T} tokens (speed = 1 / TTFT) | tinyvllm / {peer} | {ttft / ours['ttft']:.2f}x |")

def peer_hf(args):
  """--peer-only: Hugging Face transformers on the same workload (scripts/bench_peer.py); with --peer-ours (our figures, from the parent
  bench.py process), one RATIO line per figure: tinyvllm's speed / the peer's."""
  import bench_peer
  ours = json.load(open(args.peer_ours)) if args.peer_ours else {}
  dev = args.device or os.getenv("DEVICE") or bench_peer.default_device()
  device = "cuda" if dev.split(":")[0] in ("CUDA", "NV") else "cpu"   # the same GPU as ours
  model, _ = model_folder(args)
  folder, name = model or BUNDLED_MODEL, model_name(args)
  c = bench_peer.AutoConfig.from_pretrained(folder)
  if args.config: shutil.rmtree(os.path.dirname(model), ignore_errors=True)
  mml, vocab = args.max_model_len or min(c.max_position_embeddings, 4096), c.vocab_size   # the parent passes its max_model_len
  print(f"peer: {bench_peer.free_memory(device)}")
  hf, pname = bench_peer.load(c, device, args.dtype), f"{name} on transformers"
  if args.latency:
    prompt, out, T = latency_lengths(mml)
    compile = args.peer_compile or ("generate" if device == "cuda" else "none")
    if args.peer_compile is None and device != "cuda": print("peer: torch.compile skipped on CPU (--peer-compile generate to force)")
    try: dec, ttft = bench_peer.latency(hf, prompt, out, T, min(vocab, 10000), args.temperature, args.seed, compile)
    except Exception as e:   # a compiler missing on the machine, an API change: still give the eager figure, saying so
      if compile == "none": raise
      print(f"peer: WARNING the torch.compile run failed ({type(e).__name__}: {str(e)[:300]}); eager instead, on a fresh model")
      hf = bench_peer.load(c, device, args.dtype)
      dec, ttft = bench_peer.latency(hf, prompt, out, T, min(vocab, 10000), args.temperature, args.seed, "none")
    peer_latency_report(ours, name, "transformers", dev, dec, ttft, T)
  else:
    ins, outs, prompts = workload(args, vocab, mml)   # the same seeded requests as ours
    k = min(args.peer_num_requests or len(prompts), len(prompts))
    ins, outs, prompts = ins[:k], outs[:k], prompts[:k]
    dt, n_out = bench_peer.throughput(hf, prompts, [int(o) for o in outs], args.temperature, args.seed, args.max_num_batched_tokens or 2048)
    print(f"peer batched: {k} requests, {int(sum(ins))} prompt + {n_out} output tokens in {dt:.2f} s: {n_out / dt:.1f} output tok/s")
    tps = throughput_summary(pname, dev, "batched", ins, outs, dt, n_out)
    if ours and not args.sequential:
      first = f" (peer on the first {k} of {args.num_requests} reqs)" if k < args.num_requests else ""
      print(f"RATIO | {name} | {dev} | out tok/s{first} | tinyvllm / transformers | {ours['tps'] / tps:.2f}x |")

def fix_symbolic_cuda_graphs():
  """tinygrad 0.14.0's CUDAGraph sizes every launch at build time with each symbolic variable = 0: a zero grid, which
  cuGraphAddKernelNode refuses (CUDA Error 1, invalid argument); the real sizes are patched in at each call. tinygrad.llm's graphs are
  symbolic (start_pos), so for this peer only, the graph class is rebuilt with 1 there: a workaround for the upstream bug described in
  the shared tinygrad guide, section 9 (our own graphs have fixed shapes and never hit it)."""
  import inspect, tinygrad.runtime.graph.cuda as cuda_graph
  source = inspect.getsource(cuda_graph)
  assert "{v: 0 for v in self.vars}" in source, "tinygrad's CUDAGraph changed: check whether the workaround is still needed"
  namespace = dict(vars(cuda_graph))
  exec(compile(source.replace("{v: 0 for v in self.vars}", "{v: 1 for v in self.vars}"), cuda_graph.__file__, "exec"), namespace)
  Device["CUDA"].graph = namespace["CUDAGraph"]

def peer_tinygrad(args):
  """--peer-only with --peer tinygrad --latency: tinygrad's own single-stream engine, tinygrad.llm (its Transformer and generate(): one
  TinyJit for prefill chunks and one for decode, both over symbolic start_pos and chunk length), with random weights of the same shape,
  in float16 as its GGUF loader gives them (HALF=1). It runs one request at a time, so there is no throughput figure."""
  import types
  from tinygrad import nn
  # the tinygrad 0.14.0 wheel ships tinygrad/llm/model.py without the tinygrad/llm/kernels package it imports (AMD RDNA3 kernels, used
  # only on AMD): stand in for it with what model.py falls back to on every other device, nn.Linear and no custom kernels
  amd = types.ModuleType("tinygrad.llm.kernels.amd")
  amd.Linear, amd.amd_custom_kernels_supported = nn.Linear, lambda device: False
  amd.gated_delta_prefill = amd.flash_attention = None
  sys.modules.setdefault("tinygrad.llm.kernels", types.ModuleType("tinygrad.llm.kernels"))
  sys.modules.setdefault("tinygrad.llm.kernels.amd", amd)
  from tinygrad.llm.model import Transformer, TransformerConfig
  assert args.latency, "--peer tinygrad measures batch-1 decode and TTFT only: add --latency"
  ours = json.load(open(args.peer_ours)) if args.peer_ours else {}
  dev = select_device(args.device)
  if dev == "CUDA": fix_symbolic_cuda_graphs()
  # --beam as for ours, through tinygrad's JITBEAM: the shared guide measured tinygrad.llm at 480 tok/s with JITBEAM=2 on an H200
  if args.beam: os.environ["JITBEAM"] = str(args.beam)
  model, _ = model_folder(args)
  c = json.load(open(os.path.join(model or BUNDLED_MODEL, "config.json")))
  if args.config: shutil.rmtree(os.path.dirname(model), ignore_errors=True)
  name, mml = model_name(args), args.max_model_len or min(c.get("max_position_embeddings", 4096), 4096)
  head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
  config = TransformerConfig(num_blocks=c["num_hidden_layers"], dim=c["hidden_size"], hidden_dim=c["intermediate_size"],
                             n_heads=c["num_attention_heads"], n_kv_heads=c["num_key_value_heads"], norm_eps=c["rms_norm_eps"],
                             vocab_size=c["vocab_size"], head_dim=head_dim, rope_theta=c.get("rope_theta", 10000.0), rope_dim=head_dim,
                             v_head_dim=head_dim, max_context=mml)
  t = time.perf_counter()
  llm = Transformer(config)
  for p in nn.state.get_parameters(llm): p.replace(p.cast(dtypes.float16).contiguous())   # its random init, in float16
  Tensor.realize(*nn.state.get_parameters(llm))
  rng, vocab = np.random.default_rng(args.seed), min(c["vocab_size"], 10000)
  def timed(prompt_len:int, n:int) -> list[float]:   # a fresh random prompt, so its prefix cache never hits; times of each token
    gen, times = llm.generate(rng.integers(0, vocab, prompt_len).tolist(), temperature=args.temperature), [time.perf_counter()]
    for _ in range(n): next(gen); times.append(time.perf_counter())
    return times
  prompt, out, T = latency_lengths(mml)
  runs = [timed(prompt, out) for _ in range(5)][2:]   # 2 warm-up runs (JIT capture)
  print(f"peer: tinygrad.llm (JITBEAM={args.beam or 0}) start-up and 2 warm-up runs {time.perf_counter() - t:.1f} s")
  dec = statistics.median((out - 1) / (r[-1] - r[1]) for r in runs)
  ttft = statistics.median([(r := timed(T, 1))[1] - r[0] for _ in range(7)][2:])
  peer_latency_report(ours, name, "tinygrad.llm", dev, dec, ttft, T)

def model_name(args) -> str: return args.config or os.path.basename((args.model or BUNDLED_MODEL).rstrip("/"))

def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  g = p.add_mutually_exclusive_group()
  g.add_argument("--model", help="Hugging Face model folder (default: the bundled stories260K)")
  g.add_argument("--config", help="a scripts/configs folder name, e.g. llama-3.2-1b: dummy weights")
  p.add_argument("--device", help="tinygrad device: CUDA, METAL, AMD, CPU")
  p.add_argument("--latency", action="store_true", help="batch-1 decode and TTFT against rooflines instead of throughput")
  p.add_argument("--sequential", action="store_true", help="throughput with one request at a time")
  for flag, default in [("--num-requests", 256), ("--min-input", 100), ("--max-input", 1024), ("--min-output", 100), ("--max-output", 1024),
                        ("--seed", 0), ("--max-num-seqs", None), ("--max-num-batched-tokens", None), ("--block-size", None),
                        ("--max-model-len", None), ("--tensor-parallel-size", None)]: p.add_argument(flag, type=int, default=default)
  p.add_argument("--temperature", type=float, default=0.6)
  p.add_argument("--kv-cache-memory", type=float, help="GB for the KV pool")
  p.add_argument("--enforce-eager", action="store_true", default=None)
  p.add_argument("--dtype")
  p.add_argument("--beam", type=int, help="BEAM width for the decode graphs (searched once, cached in tinygrad's cache.db)")
  p.add_argument("--one-shot-all-reduce", action="store_true", help="tensor parallel, an experiment: scripts/allreduce_oneshot.py's "
                 "one-kernel all-reduce (not in the engine: it needs lines the budget lacks) in place of tinygrad's")
  p.add_argument("--copy-gib", type=float, default=1.0, help="latency: buffer size of the bandwidth test")
  p.add_argument("--matmul-size", type=int, help="latency: M=N=K of the matmul test (default 8192, 2048 on CPU)")
  p.add_argument("--peer", choices=["hf", "tinygrad"], help="also run a peer on the same workload after ours, and print the ratios: Hugging "
                 "Face transformers, or tinygrad.llm (tinygrad's single-stream engine; --latency only)")
  p.add_argument("--peer-only", action="store_true", help="run only the peer (no tinyvllm engine; no rooflines or ratios)")
  p.add_argument("--peer-ours", help=argparse.SUPPRESS)   # a JSON file of our figures, from the bench.py process that starts the peer
  p.add_argument("--peer-num-requests", type=int, help="throughput: the peer runs only the first N of the same requests (it is slow)")
  p.add_argument("--peer-compile", choices=["generate", "forward", "none"],
                 help="latency: the peer's torch.compile: generate's own of the decode step (default on CUDA), of model.forward, or none")
  args = p.parse_args()
  if args.latency and args.max_num_batched_tokens: args.max_num_batched_tokens = max(args.max_num_batched_tokens, 1024)   # the 1024-token prompt in one step
  if args.peer_only: return (peer_tinygrad if args.peer == "tinygrad" else peer_hf)(args)   # hf: the process opens no tinygrad device
  dev = select_device(args.device)
  if args.latency:   # measured before the engine exists, as on CUDA the KV pool takes 90% of the free memory
    cpu = dev.split(":")[0] == "CPU"
    bw, rate = measure_device(args.copy_gib, args.matmul_size or (2048 if cpu else 8192), dtypes.float32 if cpu else dtypes.float16)
    print(f"device {dev}: copy bandwidth {bw / 1e9:.1f} GB/s (read + write), matmul {rate / 1e12:.3g} TFLOPS "
          f"({'fp32' if cpu else 'fp16'}, {args.matmul_size or (2048 if cpu else 8192)}^3)")
  model, load_format = model_folder(args)
  name = model_name(args)
  if args.one_shot_all_reduce:
    import allreduce_oneshot
    from tinyvllm import gemm
    gemm.all_reduce = allreduce_oneshot.all_reduce
    # its workspace (flags and exchange buffers) made now: made during a graph's capture, its zeroing would be captured too
    allreduce_oneshot._workspace(tuple(Device.canonicalize(f"{dev}:{i}") for i in range(args.tensor_parallel_size)))
  t = time.perf_counter()
  llm = LLM(model, args.device, load_format=load_format, **{k: v for k in ENGINE_ARGS if (v := getattr(args, k)) is not None})
  # as the server does (AsyncLLM): the engine lives as long as this process, so no later full collection should walk its ~1M objects (a
  # warm start-up's stored caches add ~0.5M, and the first full collection then stalled decode 0.3-0.4 s)
  gc.collect(); gc.freeze()
  cfg = llm.engine.config
  print(f"engine start-up (model load + KV alloc + graph capture): {time.perf_counter() - t:.1f} s; {name} on {dev}, "
        f"{llm.engine.runner.dtype.name}, {llm.engine.runner.num_blocks} KV blocks of {cfg.block_size}, max_model_len {cfg.max_model_len}, "
        f"max_num_seqs {cfg.max_num_seqs}, max_num_batched_tokens {cfg.max_num_batched_tokens}")
  if args.latency: ours = latency(args, llm, name, dev, bw, rate)
  else: ours = {"tps": throughput(args, llm, name, dev, *workload(args, llm.engine.runner.hf_config["vocab_size"], cfg.max_model_len))}
  if args.config: shutil.rmtree(os.path.dirname(model), ignore_errors=True)
  if args.peer:   # in a process of its own (torch then never meets tinygrad's CUDA context), after ours has handed its memory back
    mml = cfg.max_model_len
    del llm, cfg; gc.collect()
    if hasattr(alloc := Device[Device.DEFAULT].allocator, "free_cache"): alloc.free_cache()
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
      json.dump(ours, f); f.flush()
      sys.stdout.flush()
      rc = subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--peer-only", "--device", dev,
                           "--max-model-len", str(mml), "--peer-ours", f.name]).returncode
    if rc: sys.exit(f"the peer's process failed (exit {rc}); our figures above stand")

if __name__ == "__main__": main()
