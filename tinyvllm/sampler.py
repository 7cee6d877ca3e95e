"""Sampling on device: temperature, top-k, top-p and seeded Gumbel-max."""
import math
from tinygrad import Tensor, dtypes

def hash_uniform(seeds:Tensor, positions:Tensor, vocab_size:int) -> Tensor:
  """(R, V) uniforms in (0, 1) that are a pure function of (request seed, output position, token id): a counter-based RNG, so a seeded
  request samples the same text whatever else shares its batch, and no per-sequence generator state lives on the host."""
  u32 = lambda t: t.cast(dtypes.uint32)
  x = u32(seeds).unsqueeze(1) * 0x9E3779B1 + u32(positions).unsqueeze(1) * 0x85EBCA77 + Tensor.arange(vocab_size, dtype=dtypes.uint32) * 0xC2B2AE3D
  for mul in (0x85EBCA6B, 0xC2B2AE35): x = (x ^ (x >> 16)) * mul   # murmur3's finalizer mixes every input bit into every output bit
  return (u32(x ^ (x >> 16)) >> 8).cast(dtypes.float32).add(0.5).div(2**24)

def threshold(probs:Tensor, enough, ways:int=16, rounds:int=6) -> Tensor:
  """Largest t with enough(probs >= t), per row, by a `ways`-ary search: top-k/top-p without sorting the vocabulary (a sort is ~100
  kernels in tinygrad). Each round tests `ways` thresholds in one pass over the row, so 6 rounds of 16 reach 2^-24 of the row's max."""
  lo, hi = probs.max(-1, keepdim=True).zeros_like(), probs.max(-1, keepdim=True)
  for _ in range(rounds):
    candidates = lo + (hi - lo) * Tensor.arange(1, ways + 1).div(ways + 1)   # (R, ways), ascending
    passed = enough(probs.unsqueeze(1) >= candidates.unsqueeze(2))[..., 0].sum(-1, keepdim=True)   # enough() falls as t rises: a prefix passes
    lo = (passed > 0).where(candidates.gather(-1, (passed - 1).maximum(0)), lo)
    hi = (passed < ways).where(candidates.gather(-1, passed.minimum(ways - 1)), hi)
  return lo

def sample(logits:Tensor, temperatures:Tensor, seeds:Tensor, positions:Tensor, top_k:Tensor|None=None, top_p:Tensor|None=None) -> Tensor:
  """Greedy rows take the argmax; the others draw by Gumbel-max (argmax of logits/T + Gumbel noise, an exact softmax sample). With
  top_k/top_p given, vLLM's top-k then top-p set is kept; rows that set neither pass through those filters unchanged."""
  x = logits / temperatures.maximum(1e-5).unsqueeze(1)
  if top_k is not None: x = top_k_top_p(x, top_k, top_p)
  gumbel = -(-hash_uniform(seeds, positions, logits.shape[1]).log()).log()
  return (temperatures == 0).where(logits.argmax(-1), (x + gumbel).argmax(-1)).cast(dtypes.int32)

def top_k_top_p(x:Tensor, top_k:Tensor, top_p:Tensor) -> Tensor:
  """x with -inf outside each row's top-k tokens and then outside the smallest set of those holding top_p of their probability."""
  probs = x.softmax(-1)
  probs = (probs >= threshold(probs, lambda keep: keep.sum(-1, keepdim=True) >= top_k.reshape(-1, 1, 1))).where(probs, 0)
  mass = lambda keep: keep.where(probs.unsqueeze(1), 0).sum(-1, keepdim=True)
  cut = threshold(probs, lambda keep: mass(keep) >= top_p.reshape(-1, 1, 1) * probs.sum(-1, keepdim=True).unsqueeze(1) * (1 - 1e-6))
  return ((probs >= cut) & (probs > 0)).where(x, -math.inf)
