"""Sampling on device, inside the step's graph: grammar masks, temperature, top-k, top-p and seeded Gumbel-max, one graph for every mix
of requests. Structured outputs are llguidance grammars (as in vLLM, SGLang and llama.cpp), compiled in tokenizer.py: here, a per-row
bitmask of allowed tokens."""
import math
from tinygrad import Tensor, dtypes

def threshold(probs:Tensor, enough, ways:int=16, rounds:int=6) -> Tensor:
  """Largest t with enough(probs >= t), per row, by a `ways`-ary search: top-k/top-p without sorting the vocabulary (a sort is ~100
  kernels in tinygrad). Each round tests `ways` thresholds in one pass over the row, so 6 rounds of 16 reach 2^-24 of the row's max."""
  lo, hi = probs.max(-1, keepdim=True).zeros_like(), probs.max(-1, keepdim=True)
  for _ in range(rounds):
    # (R, ways), ascending
    candidates = lo + (hi - lo) * Tensor.arange(1, ways + 1).div(ways + 1)
    # enough() falls as t rises: a prefix passes
    passed = enough(probs.unsqueeze(1) >= candidates.unsqueeze(2))[..., 0].sum(-1, keepdim=True)
    lo = (passed > 0).where(candidates.gather(-1, (passed - 1).maximum(0)), lo)
    hi = (passed < ways).where(candidates.gather(-1, passed.minimum(ways - 1)), hi)
  return lo

def sample(logits:Tensor, temperatures:Tensor, seeds:Tensor, positions:Tensor, top_k:Tensor|None=None, top_p:Tensor|None=None,
           min_p:Tensor|None=None, allowed:Tensor|None=None) -> Tensor:
  """Greedy rows take the argmax; the others draw by Gumbel-max (argmax of logits/T + Gumbel noise, an exact softmax sample). With the
  filters given, tokens outside a row's grammar are masked first (allowed: a bitmask, 32 tokens per int32 word, all ones without a
  grammar), then as vLLM does, tokens below min_p times the row's most likely one, and outside its top-k then top-p set; rows without
  them pass through unchanged."""
  if allowed is not None:
    bits = ((allowed.unsqueeze(-1) >> Tensor.arange(32, dtype=dtypes.int32)) & 1).reshape(logits.shape[0], -1)[:, :logits.shape[1]]
    logits = (bits != 0).where(logits, -math.inf)
  x = logits / temperatures.maximum(1e-5).unsqueeze(1)
  if top_k is not None:
    # -inf for tokens less likely than min_p times the row's most likely one, then outside the row's top-k tokens, then outside the
    # smallest set of those holding top_p of their probability
    probs = ((p := x.softmax(-1)) >= min_p.unsqueeze(1) * p.max(-1, keepdim=True)).where(p, 0)
    probs = (probs >= threshold(probs, lambda keep: keep.sum(-1, keepdim=True) >= top_k.reshape(-1, 1, 1))).where(probs, 0)
    mass = lambda keep: keep.where(probs.unsqueeze(1), 0).sum(-1, keepdim=True)
    cut = threshold(probs, lambda keep: mass(keep) >= top_p.reshape(-1, 1, 1) * probs.sum(-1, keepdim=True).unsqueeze(1) * (1 - 1e-6))
    x = ((probs >= cut) & (probs > 0)).where(x, -math.inf)
  # Gumbel noise from (R, V) uniforms in (0, 1) that are a pure function of (request seed, output position, token id): a counter-based
  # RNG, so a seeded request samples the same text whatever else shares its batch, and no per-sequence generator state lives on the host.
  # murmur3's finalizer mixes every input bit into every output bit
  u32 = lambda t: t.cast(dtypes.uint32)
  u = u32(seeds).unsqueeze(1) * 0x9E3779B1 + u32(positions).unsqueeze(1) * 0x85EBCA77 + u32(Tensor.arange(logits.shape[1])) * 0xC2B2AE3D
  for mul in (0x85EBCA6B, 0xC2B2AE35): u = (u ^ (u >> 16)) * mul
  gumbel = -(-(u32(u ^ (u >> 16)) >> 8).cast(dtypes.float32).add(0.5).div(2**24).log()).log()
  x = (temperatures == 0).unsqueeze(1).where(logits, x + gumbel)
  # the argmax (the first of equal maxima) in two passes: the row's chunks of 128 tokens, each reduced by its own thread group, then the
  # chunk holding the max. tinygrad's own argmax of a vocabulary-long row ran on 128 threads, each ~1,200 tokens in turn. (R, chunks, 128)
  x = x.pad((None, (0, -x.shape[1] % 128)), value=-math.inf).reshape(x.shape[0], -1, 128)
  # (R,) the first chunk holding the max
  best = x.max(-1).argmax(-1)
  return (best * 128 + x[Tensor.arange(x.shape[0]), best].argmax(-1)).cast(dtypes.int32)
