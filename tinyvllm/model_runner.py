import functools, math, numpy as np
from tinygrad import Tensor, TinyJit, Device, Context, dtypes
from tinyvllm.config import Config, BUNDLED_MODEL
from tinyvllm.model import read_config, load_weights, Transformer
from tinyvllm.attention import kv_write, paged_attention
from tinyvllm.sequence import Sequence

def hash_uniform(seeds:Tensor, steps:Tensor, vocab:int) -> Tensor:
  """(R, V) uniforms in (0, 1) that are a pure function of (request seed, output position, token id): a counter-based RNG, so a seeded
  request samples the same text whatever else shares its batch, and no per-sequence generator state lives on the host."""
  u32 = lambda t: t.cast(dtypes.uint32)
  x = u32(seeds).unsqueeze(1) * 0x9E3779B1 + u32(steps).unsqueeze(1) * 0x85EBCA77 + Tensor.arange(vocab, dtype=dtypes.uint32) * 0xC2B2AE3D
  for mul in (0x85EBCA6B, 0xC2B2AE35): x = (x ^ (x >> 16)) * mul   # murmur3's finalizer mixes every input bit into every output bit
  return (u32(x ^ (x >> 16)) >> 8).cast(dtypes.float32).add(0.5).div(2**24)

def threshold(probs:Tensor, enough) -> Tensor:
  """Largest t with enough(probs >= t), by bisection: top-k/top-p without sorting the vocabulary (a sort is ~100 kernels in tinygrad)."""
  lo, hi = probs.max(-1, keepdim=True).zeros_like(), probs.max(-1, keepdim=True)
  for _ in range(24):
    ok = enough(probs >= (mid := (lo + hi) / 2))
    lo, hi = ok.where(mid, lo), ok.where(hi, mid)
  return lo

def sample(logits:Tensor, temps:Tensor, seeds:Tensor, steps:Tensor, top_k:Tensor, top_p:Tensor, filtered:bool) -> Tensor:
  """On-device sampling: greedy rows take the argmax, the others Gumbel-max (argmax of logits/T + Gumbel noise, an exact softmax sample)."""
  x = logits / temps.maximum(1e-5).unsqueeze(1)
  if filtered:   # vLLM's order: keep the top-k tokens, then the smallest set of those holding top_p of their probability
    p = x.softmax(-1)
    p = (p >= threshold(p, lambda keep: keep.sum(-1, keepdim=True) >= top_k.unsqueeze(1))).where(p, 0)
    tp = threshold(p, lambda keep: keep.where(p, 0).sum(-1, keepdim=True) >= top_p.unsqueeze(1) * p.sum(-1, keepdim=True) * (1 - 1e-6))
    x = ((p >= tp) & (p > 0)).where(x, -math.inf)
  gumbel = -(-hash_uniform(seeds, steps, logits.shape[1]).log()).log()
  return (temps == 0).where(logits.argmax(-1), (x + gumbel).argmax(-1)).cast(dtypes.int32)

class ModelRunner:
  """Turns a scheduled batch into one forward pass over the flattened tokens of all its sequences (prefill chunks and decodes alike),
  writes their K/V into the paged pool, and samples on device. Each padded token-count bucket is a TinyJit graph."""
  def __init__(self, config:Config):
    self.config, self.device = config, Device.DEFAULT
    if config.attention not in ("kernel", "gather"): raise ValueError(f"attention must be 'kernel' or 'gather', got {config.attention!r}")
    self.use_kernel = config.attention == "kernel"
    model_dir = config.model or BUNDLED_MODEL
    c = self.hf = read_config(model_dir)
    ckpt = c.get("torch_dtype") or c.get("dtype") or "float32"   # GPUs compute in the checkpoint's 16-bit type (fp16 for fp32 ones)
    self.dtype = getattr(dtypes, config.dtype) if config.dtype != "auto" else dtypes.float32 if self.device == "CPU" else \
      dtypes.bfloat16 if ckpt == "bfloat16" else dtypes.float16
    config.max_model_len = min(config.max_model_len or 4096, c.get("max_position_embeddings", 4096))
    self.model = Transformer(c, load_weights(model_dir, c, self.dtype, dummy=config.load_format == "dummy"), config.max_model_len)
    L, KV, hd, bs = c["num_hidden_layers"], c["num_key_value_heads"], c["head_dim"], config.block_size
    bytes_per_block = 2 * L * bs * KV * hd * self.dtype.itemsize
    gb = config.kv_cache_memory or self.default_kv_gb(config.max_num_seqs * config.max_model_len // bs * bytes_per_block / 1e9)
    self.num_blocks = max(int(gb * 1e9 // bytes_per_block), 1)
    config.max_model_len = min(config.max_model_len, self.num_blocks * bs)   # one sequence must always fit, or preemption can't help
    self.kv = [[Tensor.zeros(self.num_blocks * bs, KV, hd, dtype=self.dtype).contiguous().realize() for _ in "kv"] for _ in range(L)]
    self.max_blocks = -(-config.max_model_len // bs)
    top = max(config.max_num_batched_tokens, config.max_num_seqs)
    self.buckets = sorted({min(2**i, top) for i in range(top.bit_length() + 1)})
    self.graphs: dict[tuple[int, bool], TinyJit] = {}

  def default_kv_gb(self, enough:float) -> float:
    if self.device != "CUDA": return min(enough, 4.0)
    import ctypes, tinygrad.runtime.autogen.cuda as cuda   # the one device where tinygrad can tell us free memory: take 90% of it
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    return 0.9 * free.value / 1e9

  def forward(self, ints:Tensor, floats:Tensor, N:int, R:int, filtered:bool) -> Tensor:
    """ints packs the step's int inputs into one host->device copy: 5 rows of N per-token values, the block tables, 4 rows of R per-sample values."""
    MB = self.max_blocks   # a step holds at most R = min(N, max_num_seqs) sequences: that many block-table rows and sampled rows
    tokens, positions, slots, token_seq, cached_lens = [ints[i*N:(i+1)*N] for i in range(5)]
    block_tables = ints[5*N:5*N + R*MB].reshape(R, MB)
    logits_idx, seeds, steps, top_k = [ints[5*N + R*MB + i*R:5*N + R*MB + (i+1)*R] for i in range(4)]
    def attention(i:int, q:Tensor, k:Tensor, v:Tensor) -> Tensor:
      k_pool, v_pool = kv_write(*self.kv[i], slots, k, v)
      return paged_attention(q, k, v, k_pool, v_pool, block_tables, token_seq, positions, cached_lens, self.config.block_size, self.use_kernel)
    h = self.model(tokens, positions, attention)[logits_idx]   # only the rows that sample need the LM head
    logits = (h @ self.model.lm_head.T).float()
    return sample(logits, floats[:R], seeds, steps, top_k, floats[R:], filtered).contiguous()

  def run(self, batch:list[tuple[Sequence, int]], N:int|None=None) -> list[int]:
    """Computes n tokens of each (seq, n); returns one sampled token for every sequence whose last token was computed, in batch order."""
    bs, S, MB, V = self.config.block_size, self.config.max_num_seqs, self.max_blocks, self.hf["vocab_size"]
    N = N or next(b for b in self.buckets if b >= sum(n for _, n in batch))
    R = min(N, S)
    tok = np.zeros((5, N), np.int32); tok[2] = -1    # padding rows write nowhere and attend to position 0
    bt, per_row, fl = np.zeros((R, MB), np.int32), np.zeros((4, R), np.int32), np.zeros((2, R), np.float32)
    off = r = 0
    for s, (seq, n) in enumerate(batch):
      pos = np.arange(seq.num_computed_tokens, seq.num_computed_tokens + n)
      bt[s, :len(seq.block_table)] = table = np.array(seq.block_table, np.int32)
      tok[:, off:off+n] = np.stack([seq.token_ids[pos[0]:pos[-1]+1], pos, table[pos // bs] * bs + pos % bs, np.full(n, s), np.full(n, pos[0])])
      if pos[-1] + 1 == len(seq):
        p = seq.params
        per_row[:, r], fl[:, r] = [off + n - 1, seq.seed, len(seq), min(p.top_k, V) if p.top_k > 0 else V], [p.temperature, p.top_p]
        r += 1
      off += n
    filtered = any(seq.params.top_k > 0 or seq.params.top_p < 1 for seq, _ in batch)
    ints, floats = Tensor(np.concatenate([tok.ravel(), bt.ravel(), per_row.ravel()])), Tensor(fl.ravel())
    if self.config.enforce_eager: out = self.forward(ints, floats, N, R, filtered)
    else: out = self.graphs.setdefault((N, filtered), TinyJit(functools.partial(self.forward, N=N, R=R, filtered=filtered)))(ints, floats)
    return out.tolist()[:r]

  def warmup(self):
    """Capture every step graph up front (a TinyJit records on its second call), so no request pays for compiling or capturing."""
    for N in self.buckets * 2:
      with Context(BEAM=self.config.beam if N <= self.config.max_num_seqs else 0): self.run([], N)
