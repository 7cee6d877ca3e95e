import functools, itertools, math, numpy as np
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

  def forward(self, ints:Tensor, N:int, R:int, filtered:bool) -> Tensor:
    """ints packs all the step's inputs into one host->device copy: 5 rows of N per-token values, the block tables, 4 rows of R per-sample
    ints and 2 rows of R per-sample floats (their bits: temperature, top_p)."""
    MB = self.max_blocks   # a step holds at most R = min(N, max_num_seqs) sequences: that many block-table rows and sampled rows
    tokens, positions, slots, token_seq, cached_lens = [ints[i*N:(i+1)*N] for i in range(5)]
    block_tables = ints[5*N:5*N + R*MB].reshape(R, MB)
    logits_idx, seeds, steps, top_k, temps, top_p = [ints[5*N + R*MB + i*R:5*N + R*MB + (i+1)*R] for i in range(6)]
    def attention(i:int, q:Tensor, k:Tensor, v:Tensor) -> Tensor:
      k_pool, v_pool = kv_write(*self.kv[i], slots, k, v)
      return paged_attention(q, k, v, k_pool, v_pool, block_tables, token_seq, positions, cached_lens, self.config.block_size, self.use_kernel)
    h = self.model(tokens, positions, attention)[logits_idx]   # only the rows that sample need the LM head
    logits = (h @ self.model.lm_head.T).float()
    return sample(logits, temps.bitcast(dtypes.float32), seeds, steps, top_k, top_p.bitcast(dtypes.float32), filtered).contiguous()

  def run(self, batch:list[tuple[Sequence, int]], N:int|None=None) -> list[int]:
    """Computes n tokens of each (seq, n); returns one sampled token for every sequence whose last token was computed, in batch order."""
    bs, S, MB, V = self.config.block_size, self.config.max_num_seqs, self.max_blocks, self.hf["vocab_size"]
    # one Python pass gathers each sequence's scalars, then all per-token and per-block work is numpy: a loop of numpy calls per
    # sequence cost ~8 ms of host time a step at batch 256, which the GPU would spend idle
    rows = [(s.num_computed_tokens, k, len(s), len(s.block_table), s.seed) for s, k in batch]
    done, n, length, nblocks, seed = np.array(rows, int).reshape(-1, 5).T
    top_k, temp, top_p = np.array([(s.params.top_k, s.params.temperature, s.params.top_p) for s, _ in batch]).reshape(-1, 3).T
    N = N or next(b for b in self.buckets if b >= n.sum())
    R, T, row = min(N, S), n.sum(), np.repeat(np.arange(len(batch)), n)   # row: each token's sequence in the batch
    ints = np.zeros(5*N + R*MB + 6*R, np.int32)
    tok, bt, per_row = ints[:5*N].reshape(5, N), ints[5*N:5*N + R*MB].reshape(R, MB), ints[5*N + R*MB:].reshape(6, R)
    tok[2] = -1    # padding rows write nowhere and attend to position 0
    bt[:len(batch)][np.arange(MB) < nblocks[:, None]] = np.fromiter(itertools.chain(*(s.block_table for s, _ in batch)), int)
    pos = np.arange(T) - np.repeat(np.cumsum(n) - n, n) + done[row]
    ids = np.fromiter(itertools.chain(*(s.token_ids[s.num_computed_tokens:s.num_computed_tokens + k] for s, k in batch)), int, T)
    tok[:, :T] = ids, pos, bt[row, pos // bs] * bs + pos % bs, row, done[row]   # done: positions cached by earlier steps
    r = (last := done + n == length).sum()   # sequences whose last token is computed sample one
    per_row[:4, :r] = np.cumsum(n)[last] - 1, seed[last], length[last], np.where(top_k[last] > 0, np.minimum(top_k[last], V), V)
    per_row[4:, :r] = np.float32([temp[last], top_p[last]]).view(np.int32)
    filtered = bool((top_k > 0).any() or (top_p < 1).any())
    ints = Tensor(ints)
    if self.config.enforce_eager: out = self.forward(ints, N, R, filtered)
    else: out = self.graphs.setdefault((N, filtered), TinyJit(functools.partial(self.forward, N=N, R=R, filtered=filtered)))(ints)
    return out.tolist()[:r]

  def warmup(self):
    """Capture every step graph up front (a TinyJit records on its second call), so no request pays for compiling or capturing."""
    for N in self.buckets * 2:
      with Context(BEAM=self.config.beam if N <= self.config.max_num_seqs else 0): self.run([], N)
