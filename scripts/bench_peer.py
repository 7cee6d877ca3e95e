"""Peers for scripts/bench.py (`--peer hf`): Hugging Face transformers on the same workload, weights shape and device.

Throughput: transformers' own continuous batching (the ContinuousBatchingManager of `init_continuous_batching`; each request added with its
own max_new_tokens), random weights of the same config, the same prompts and output lengths, no EOS, temperature 0.6 (nothing else in the
sampling chain). The manager's warm-up (CUDA graph capture) is left out of the timing, as bench.py leaves our start-up out.
Latency: batch 1 through `model.generate` with `cache_implementation="static"` and torch.compile in mode "reduce-overhead" (CUDA graphs):
by default generate's own compile of the decode step (transformers >= 4.47 does it for a static cache; the prefill stays eager, as the static
cache wants), or with --peer-compile forward the older recipe `model.forward = torch.compile(model.forward, ...)`; warm-up runs left out.
transformers' API moves between releases, so the optional parts (workload hints, warm-up, the CB config) are used only where present, and
the output says which were.
"""
import inspect, statistics, time
import numpy as np
import torch, transformers
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

def load(config:AutoConfig, device:str, dtype:str|None=None) -> AutoModelForCausalLM:
  """Random-initialised model of the config: bf16 on CUDA, float32 on CPU (so the script runs on a laptop), unless --dtype."""
  dt = getattr(torch, {"half": "float16", "float": "float32"}.get(dtype, dtype)) if dtype else torch.bfloat16 if device == "cuda" else torch.float32
  t = time.perf_counter()
  with torch.device(device):
    try: model = AutoModelForCausalLM.from_config(config, dtype=dt)
    except TypeError: model = AutoModelForCausalLM.from_config(config, torch_dtype=dt)   # transformers < 4.56
  print(f"peer: transformers {transformers.__version__}, torch {torch.__version__}, {type(model).__name__} random init on {device} in "
        f"{time.perf_counter() - t:.1f} s: {sum(p.numel() for p in model.parameters()) / 1e6:,.1f} M params, {dt}, "
        f"attention {model.config._attn_implementation}")
  return model.eval()

def default_device() -> str: return "CUDA" if torch.cuda.is_available() else "CPU"

def free_memory(device:str) -> str:
  if device != "cuda": return device
  torch.cuda.empty_cache()
  free, total = torch.cuda.mem_get_info()
  return f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free on {torch.cuda.get_device_name()}"

def _supported(fn, **kw) -> dict:
  """The keyword arguments of kw that fn takes (None values dropped)."""
  params = inspect.signature(fn).parameters
  return {k: v for k, v in kw.items() if v is not None and k in params}

@torch.no_grad()
def throughput(model, prompts:list[list[int]], outs:list[int], temperature:float, seed:int, max_batch_tokens:int) -> tuple[float, int]:
  """Runs every request through transformers' continuous batching at once; returns (seconds, output tokens generated)."""
  torch.manual_seed(seed)
  gen = GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0, eos_token_id=-1, pad_token_id=0,
                         max_new_tokens=max(outs))   # eos -1: transformers' own "no EOS" (ignore_eos)
  kw, used = {}, []
  try:
    from transformers.generation.continuous_batching.utils import WorkloadHints
    kw["workload_hints"] = WorkloadHints(max_prompt_length=max(map(len, prompts)), max_generated_length=max(outs), num_requests=len(prompts))
  except ImportError: pass
  try:
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    cb = {f: v for f, v in [("seed", seed)] if f in getattr(ContinuousBatchingConfig, "__dataclass_fields__", {})}
    # on CPU transformers sizes its warm-up batches for a GPU (an 8192 x 160k attention mask): cap them at bench.py's token budget
    if model.device.type == "cpu": cb |= dict(max_batch_tokens=max_batch_tokens, num_blocks=sum(map(len, prompts)) // 64 + 2 * len(prompts) + 8)
    kw["continuous_batching_config"] = ContinuousBatchingConfig(**cb)
  except ImportError: pass
  kw = _supported(model.init_continuous_batching, generation_config=gen, **kw)
  used.append("init_continuous_batching(" + ", ".join(kw) + ")")
  mgr, t = model.init_continuous_batching(**kw), time.perf_counter()
  if hasattr(mgr, "warmup"): mgr.warmup(); used.append("warmup()")
  mgr.start()
  print(f"peer: {' + '.join(used)} + add_request(ids, max_new_tokens=k) per request; warm-up and start {time.perf_counter() - t:.1f} s")
  if (cfg := getattr(mgr, "continuous_batching_config", None)) is not None:
    print("peer: CB config: " + ", ".join(f"{k}={getattr(cfg, k, None)}" for k in ("page_size", "block_size", "num_blocks", "max_batch_tokens",
          "max_requests_per_batch", "max_memory_percent", "use_cuda_graph", "use_async_batching", "default_compile_level")
          if getattr(cfg, k, None) is not None))
  t = time.perf_counter()
  try:
    want = {mgr.add_request(p, max_new_tokens=int(k)): int(k) for p, k in zip(prompts, outs)}
    n_out, left, short = 0, set(want), 0
    while left:
      r = mgr.get_result(timeout=1)
      if r is None:
        if hasattr(mgr, "is_running") and not mgr.is_running(): raise RuntimeError(f"transformers' generation thread stopped, {len(left)} left")
        continue
      if not r.is_finished() or r.request_id not in left: continue
      if getattr(r, "error", None): raise RuntimeError(f"request {r.request_id}: {r.error}")
      left.discard(r.request_id); n_out += len(r.generated_tokens); short += len(r.generated_tokens) < want[r.request_id]
    dt = time.perf_counter() - t
  finally: mgr.stop(block=True)
  if short: print(f"peer: WARNING {short} requests stopped before their max_new_tokens")
  return dt, n_out

class _Stamps:
  """A generate() streamer that notes the time of each put: the prompt first, then one token per decode step (put() gets the token
  .cpu()'d, so the device work is done by then)."""
  def __init__(self): self.t = []
  def put(self, value): self.t.append(time.perf_counter())
  def end(self): pass

@torch.no_grad()
def latency(model, prompt:int, out:int, T:int, vocab:int, temperature:float, seed:int, compile:str) -> tuple[float, float]:
  """(batch-1 decode tok/s after a `prompt`-token prompt for `out` tokens, TTFT seconds of a T-token prompt), each a median after 2
  warm-up runs, fresh random prompts each run (as bench.py's latency). compile: "generate" (generate's own torch.compile of the decode
  step, which it does when the cache is static: mode reduce-overhead, fullgraph; the prefill stays eager), "forward" (the older recipe,
  model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True), prefill included) or "none"."""
  rng = np.random.default_rng(seed)
  torch.manual_seed(seed)
  model.generation_config.eos_token_id = None   # ignore_eos; also min_new_tokens below
  cc = None
  if compile == "generate":
    cc = transformers.CompileConfig(fullgraph=True, mode="reduce-overhead")
    if model.device.type != "cuda": cc._compile_all_devices = True   # generate compiles only on GPUs unless told
  gen = lambda new: GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0, eos_token_id=None, pad_token_id=0,
                                    max_new_tokens=new, min_new_tokens=new, cache_implementation="static", compile_config=cc,
                                    disable_compile=compile != "generate")
  if compile == "forward": model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
  print("peer: model.generate, cache_implementation='static', " + {"generate": "generate's torch.compile of the decode step "
        "(CompileConfig(fullgraph=True, mode='reduce-overhead'))", "forward": "torch.compile(model.forward, mode='reduce-overhead', "
        "fullgraph=True)", "none": "no torch.compile (eager)"}[compile])
  def run(n:int, new:int) -> list[float]:
    x, s = torch.tensor([rng.integers(0, vocab, n).tolist()], device=model.device), _Stamps()
    t0 = time.perf_counter()
    res = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gen(new), streamer=s)
    assert res.shape[1] - n == new == len(s.t) - 1, (res.shape, n, new, len(s.t))
    return [u - t0 for u in s.t[1:]]
  t = time.perf_counter()
  runs = [run(prompt, out) for _ in range(5)]
  print(f"peer: decode runs (first 2 warm-up) {', '.join(f'{r[-1]:.2f}' for r in runs)} s; {time.perf_counter() - t:.1f} s")
  dec = statistics.median((len(r) - 1) / (r[-1] - r[0]) for r in runs[2:])
  t = time.perf_counter()
  ttfts = [run(T, 1)[0] for _ in range(7)]
  print(f"peer: TTFT runs (first 2 warm-up) {', '.join(f'{x * 1e3:.1f}' for x in ttfts)} ms; {time.perf_counter() - t:.1f} s")
  return dec, statistics.median(ttfts[2:])
