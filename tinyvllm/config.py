"""The settings: one Config that flows from the CLI or LLM() into every part of the engine (its field comments are serve.py's --help),
the engine's log, and where the model and the device come from (model_path, select_device, before any tensor exists). Read by every
layer; it imports nothing of the engine."""
# huggingface_hub loads its hub client only when called
import dataclasses, json, logging, os, huggingface_hub

BUNDLED_MODEL = os.path.join(os.path.dirname(__file__), "stories260K")
# the engine's log (serve.py has its own)
log = logging.getLogger("tinyvllm")

@dataclasses.dataclass
class Config:
  """One config that flows from the CLI / LLM() into every part of the engine, as in nano-vllm."""
  model: str | None = None               # Hugging Face folder or hub id (org/name); None serves the bundled stories260K
  device: str | None = None              # tinygrad device (CUDA, METAL, AMD, CPU); falls back to $DEVICE, then tinygrad's default
  dtype: str = "auto"                    # compute dtype: auto = checkpoint's 16-bit dtype on GPUs, float32 on CPU
  load_format: str = "auto"              # "dummy" = random weights from config.json alone, for benchmarks (as in vLLM)
  max_model_len: int | None = None       # context length; default min(config's max_position_embeddings, 4096, the KV pool)
  max_num_seqs: int | None = None        # most sequences in one step (the most rows sampled in one); None = 256 on a GPU, 64 on the CPU
  max_num_batched_tokens: int | None = None  # token budget of one step; long prompts are chunked to fit it; None = 2048 on a GPU, 512 on the CPU
  block_size: int = 16                   # tokens per KV block
  kv_cache_memory: float | None = None   # GB for the KV pool; None = a share of free device memory where tinygrad can tell
  enable_prefix_caching: bool = True     # share the KV blocks of equal prompt prefixes across requests
  enforce_eager: bool = False            # no TinyJit graphs, for debugging
  seed: int = 0                          # seeds the per-request seeds of requests that don't set one, so offline runs are repeatable
  tensor_parallel_size: int = 1          # devices DEVICE:0..N-1 that split every layer (Megatron: attention heads and MLP columns)
  beam: int = 0                          # BEAM width for the decode graphs' kernels (tinygrad's BEAM), searched once and kept in its cache.db
  def __post_init__(self):
    positive = ("tensor_parallel_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size", "kv_cache_memory")
    if bad := [name for name in positive if getattr(self, name) is not None and not getattr(self, name) > 0]:
      raise ValueError(f"{', '.join(bad)} must be positive (leave unset for the default)")

def weight_files(folder:str, index:str="model.safetensors.index.json") -> set[str]:
  """The safetensors files of a model folder that load_weights reads: those a sharded checkpoint's index names, else model.safetensors."""
  return set(json.load(open(f"{folder}/{index}"))["weight_map"].values()) if index in os.listdir(folder) else {"model.safetensors"}

def model_path(model:str|None, weights:bool=True) -> str:
  """A local folder as it is; otherwise a Hugging Face hub id, downloaded once into the hub's cache as vLLM does: its json files first,
  then (weights) only the weight files the loader reads, as vLLM filters them through the index. A repo may hold others beside them:
  Mistral-7B-Instruct-v0.3's consolidated.safetensors (14.5 GB) beside its Hugging Face shards."""
  if model is None or os.path.isdir(model): return model or BUNDLED_MODEL
  files = weight_files(model_path(model, weights=False)) if weights else set()
  try: return huggingface_hub.snapshot_download(model, allow_patterns=["*.json", "*.jinja", *files])
  except Exception as e:
    raise ValueError(f"model {model!r} is not a local folder and could not be fetched from the Hugging Face hub ({type(e).__name__})") from None

def select_device(device:str|None) -> str:
  """Map --device / $DEVICE onto tinygrad's DEV before any tensor exists; unknown devices fail listing what tinygrad can open."""
  from tinygrad import Device, helpers
  if device := device or os.getenv("DEVICE"): helpers.DEV.value = device
  try: return Device[Device.DEFAULT].device
  except Exception as e:
    raise RuntimeError(f"device {device!r} is not usable ({type(e).__name__}: {e}); tinygrad found: {list(Device.get_available_devices())}") from None
