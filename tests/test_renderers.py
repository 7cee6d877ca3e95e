"""Every kernel of a real engine run, rendered for GPUs that no CI machine has, and checked against their limits. The Llama-3.2-1B,
Llama-3.1-8B and Qwen3-30B-A3B shapes (dummy weights, one decoder layer: every layer runs the same kernels; the hidden sizes, heads and
vocabulary are the model's) go through a 1024-token prompt, a decode step, an 8-token prompt and a decode step through the filtering
sampler on tinygrad's NULL device: nothing executes, and every kernel is rendered as the GPU would get it (our kernels' GPU form, tinygrad's
own optimizations for that renderer, its emulation of a dtype the GPU lacks). Limits: threadgroup memory (Apple 32 KB, AMD 64 KB of LDS,
48 KB on NVIDIA, the OpenCL we run) and 1024 threads a threadgroup. METAL's and AMD's compilers (macOS, AMD's comgr) are not here: their
renderers are built with a pass-through compiler. One process per engine, as the NULL device is the process's default device; its kernels
are rendered there for every GPU that would build the same kernels (the same dtype, natively or emulated alike)."""
import json, math, os, subprocess, sys, tempfile, pathlib
from concurrent.futures import ThreadPoolExecutor

ROOT = pathlib.Path(__file__).resolve().parents[1]
# name: (renderer class, target arch, threadgroup memory bytes, threads a threadgroup)
GPUS = {"OpenCL": ("OpenCLRenderer", "", 48 * 1024, 1024), "METAL": ("MetalRenderer", "Apple9", 32 * 1024, 1024),
        "gfx1100": ("HIPRenderer", "gfx1100", 64 * 1024, 1024), "gfx942": ("HIPRenderer", "gfx942", 64 * 1024, 1024)}
# (dtype, the GPUs whose kernels one engine run gives): the dtypes each GPU would run. NVIDIA's OpenCL has no cl_khr_fp16, so tinygrad
# emulates half there (its kernels differ); bf16 it renders as 16-bit words with casts of its own
RUNS = [("float16", ("OpenCL",)), ("float16", ("METAL", "gfx1100", "gfx942")), ("bfloat16", tuple(GPUS)), ("float32", tuple(GPUS))]
MODELS = ["llama-3.2-1b", "llama-3.1-8b", "qwen3-30b-a3b"]

def renderer(gpu:str):
  from tinygrad.helpers import Target
  import tinygrad.renderer.cstyle as cstyle
  cls, arch, *_ = GPUS[gpu]
  return getattr(cstyle, cls)(Target("NULL", cls.removesuffix("Renderer").upper(), arch))

def run_engine(model:str, dtype:str, *gpus:str):
  """The child: one engine on the NULL device; prints one line per kernel and GPU (its threadgroup memory and threads, or its error)."""
  import shutil, types
  from tinygrad.device import Compiler
  from tinygrad.uop.ops import Ops
  from tinygrad.dtype import AddrSpace
  from tinygrad import Tensor, Device
  import tinygrad.runtime.support.compiler_amd as amd, tinygrad.engine.realize as realize
  amd.HIPCompiler = lambda arch: Compiler()
  sys.modules["tinygrad.runtime.ops_metal"] = types.SimpleNamespace(MetalCompiler=Compiler)
  # dummy weights need no random kernels where nothing executes
  Tensor.uniform = lambda *shape, low=0, high=1, **kwargs: Tensor.empty(*shape, **kwargs)
  renderers = {gpu: renderer(gpu) for gpu in gpus}
  to_program = realize.to_program
  def render_everywhere(ast, ren):
    for gpu, r in renderers.items():
      try: prg = to_program(ast, r)
      except Exception as e:
        # a kernel of tinygrad's own has no name yet: its buffers say which
        params = [f"{p.dtype} x {p.src[0].arg}" for p in ast.toposort() if p.op is Ops.PARAM]
        name = f"{'tinygrad kernel' if ast.arg.name == 'test' else ast.arg.name} of {params}"
        print("KERNEL", json.dumps({"gpu": gpu, "name": name, "error": f"{type(e).__name__}: {e}"[:300]}), flush=True)
        continue
      lin, threads = prg.src[1], math.prod(prg.arg.local_size or (1,))
      smem = sum(math.prod(u.shape) * u.dtype.itemsize for u in lin.src if u.op is Ops.BUFFER and u.arg.addrspace is AddrSpace.LOCAL)
      print("KERNEL", json.dumps({"gpu": gpu, "name": prg.arg.function_name, "smem": smem, "threads": threads}), flush=True)
    # the engine goes on with the NULL device's own
    return to_program(ast, ren)
  realize.to_program = render_everywhere
  # the config folder with a stand-in tokenizer (stories260K's: the engine decodes ids past its 512 as ""), one decoder layer
  from tinyvllm.config import BUNDLED_MODEL
  config = json.load(open(ROOT / "scripts" / "configs" / model / "config.json"))
  config = {k: v for k, v in config.items() if k not in ("bos_token_id", "eos_token_id")} | {"num_hidden_layers": 1}
  os.makedirs(folder := os.path.join(tempfile.mkdtemp(), model))
  json.dump(config, open(os.path.join(folder, "config.json"), "w"))
  for f in ("tokenizer.json", "tokenizer_config.json"): shutil.copy(os.path.join(BUNDLED_MODEL, f), folder)
  from tinyvllm.llm_engine import LLM
  from tinyvllm.sequence import SamplingParams
  llm = LLM(folder, load_format="dummy", dtype=dtype, enforce_eager=True, max_model_len=1280, max_num_seqs=4, max_num_batched_tokens=1024,
            kv_cache_memory=0.05)
  assert Device[Device.DEFAULT].renderer.has_local
  # a 1024-token prompt (the dense in-step attention, prompt-sized matmuls, MoE tiles) and a greedy decode step (GEMV, paged attention
  # alone, the embedding's split gather); an 8-token prompt (the GEMV over 8 rows) and a decode step through the filtering sampler
  llm.generate([list(range(1, 1025))], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True), use_tqdm=False)
  llm.generate([list(range(1, 9))], SamplingParams(max_tokens=2, temperature=0.8, top_k=20, top_p=0.9, ignore_eos=True), use_tqdm=False)

def kernels(model:str, dtype:str, gpus:tuple[str, ...]) -> list[dict]:
  cls, arch, *_ = GPUS[gpus[0]]
  env = os.environ | {"DEV": f"NULL:{cls.removesuffix('Renderer').upper()}" + (f":{arch}" if arch else ""), "NULL_ALLOW_COPYOUT": "1",
                      "PARALLEL": "0", "PYTHONPATH": str(ROOT)}
  proc = subprocess.run([sys.executable, __file__, model, dtype, *gpus], env=env, capture_output=True, text=True, timeout=1800)
  found = [json.loads(line[7:]) | {"model": model, "dtype": dtype} for line in proc.stdout.splitlines() if line.startswith("KERNEL ")]
  # a kernel that fails to build stops the engine: the test names it
  assert proc.returncode == 0 or any("error" in k for k in found), proc.stderr[-3000:]
  return found

# CI's share (~3 minutes for this file and the emulator tests on 2 cores): every kind of dtype handling once, each model once. 1B in
# emulated half on OpenCL (dense MLP, head_dim 64, tied embeddings); Qwen3-30B-A3B in bf16 (MoE blocks, q/k norms, 8 query heads a KV head),
# on OpenCL as 16-bit words, METAL natively and gfx1100 through casts of tinygrad's own (with their tensor cores); 8B in native half on
# gfx942 (head_dim 128, its own LM head, CDNA's tensor cores). RENDER_ALL=1: every model in every dtype on every GPU (RUNS)
CI = [("llama-3.2-1b", "float16", ("OpenCL",)), ("qwen3-30b-a3b", "bfloat16", ("OpenCL", "METAL", "gfx1100")),
      ("llama-3.1-8b", "float16", ("gfx942",))]

def test_engine_kernels_render_within_limits():
  jobs = [(m, d, g) for m in MODELS for d, g in RUNS] if os.getenv("RENDER_ALL") else CI
  # two engines at a time: one a core
  with ThreadPoolExecutor(2) as pool: found = [k for ks in pool.map(lambda job: kernels(*job), jobs) for k in ks]
  for model, dtype, gpus in jobs:
    for gpu in gpus:
      names = {k["name"] for k in found if (k["model"], k["dtype"], k["gpu"]) == (model, dtype, gpu)}
      assert {"kv_write", "paged_attention"} <= names and any(n.startswith("gemv") for n in names), (model, dtype, gpu, names)
  failed = [f"{k['model']} {k['dtype']} {k['gpu']} {k['name']}: {k['error']}" for k in found if "error" in k]
  over = [f"{k['model']} {k['dtype']} {k['gpu']} {k['name']}: {k['smem']} B shared, {k['threads']} threads" for k in found
          if "error" not in k and (k["smem"] > GPUS[k["gpu"]][2] or k["threads"] > GPUS[k["gpu"]][3])]
  assert not failed and not over, failed + over

if __name__ == "__main__": run_engine(*sys.argv[1:])
