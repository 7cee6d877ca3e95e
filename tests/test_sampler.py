"""The sampler's filters against a numpy reference of vLLM's formulas: min_p keeps the tokens whose probability (after temperature) is at
least min_p times the row's largest, then top-k keeps the k most likely, then top-p keeps the smallest set of those holding top_p of their
renormalized mass; the draw follows the renormalized probabilities of what is kept. Each of the ROWS rows has its own seed, so one call
gives ROWS independent draws."""
import numpy as np, pytest
from tinygrad import Tensor
from tinyvllm.sampler import sample

ROWS, VOCAB, TEMPERATURE = 4000, 24, 0.8
LOGITS = np.random.default_rng(0).normal(0, 1.5, VOCAB).astype(np.float32)

def reference(min_p:float, top_k:int, top_p:float) -> np.ndarray:
  """vLLM's kept set and renormalized probabilities, in numpy."""
  probs = np.exp(LOGITS / TEMPERATURE - (LOGITS / TEMPERATURE).max())
  probs /= probs.sum()
  keep = probs >= min_p * probs.max()
  keep &= probs >= np.sort(np.where(keep, probs, 0))[::-1][top_k - 1]
  order = np.argsort(-np.where(keep, probs, 0))
  mass = np.cumsum(np.where(keep, probs, 0)[order]) / probs[keep].sum()
  keep[order[np.searchsorted(mass, top_p - 1e-6) + 1:]] = False   # the smallest prefix whose mass reaches top_p
  return np.where(keep, probs, 0) / probs[keep].sum()

def draws(min_p:float|None, top_k:int=VOCAB, top_p:float=1.0) -> np.ndarray:
  per_row = lambda value, dtype: Tensor(np.full(ROWS, value, dtype))
  filters = () if min_p is None else (per_row(top_k, np.int32), per_row(top_p, np.float32), per_row(min_p, np.float32))
  tokens = sample(Tensor(np.tile(LOGITS, (ROWS, 1))), per_row(TEMPERATURE, np.float32), Tensor(np.arange(ROWS, dtype=np.int32)),
                  per_row(7, np.int32), *filters)
  return np.bincount(tokens.numpy(), minlength=VOCAB)

@pytest.mark.parametrize("min_p,top_k,top_p", [(0.05, VOCAB, 1.0), (0.3, VOCAB, 1.0), (0.1, 6, 1.0), (0.1, VOCAB, 0.7), (0.2, 8, 0.6)])
def test_min_p_then_top_k_then_top_p_follow_the_reference(min_p, top_k, top_p):
  expected, counts = reference(min_p, top_k, top_p), draws(min_p, top_k, top_p)
  assert set(np.flatnonzero(counts)) == set(np.flatnonzero(expected))   # only kept tokens are drawn, and every kept token is
  chi2 = (((counts - ROWS * expected) ** 2) / np.maximum(ROWS * expected, 1e-9))[expected > 0].sum()
  assert chi2 < 3 * max(1, (expected > 0).sum() - 1) + 20, (counts, np.round(ROWS * expected))   # far inside chance for these sizes

def test_min_p_one_keeps_only_the_argmax():
  assert np.flatnonzero(draws(1.0)).tolist() == [LOGITS.argmax()]

def test_a_seeded_row_without_filters_draws_the_same_in_either_sampler_variant():
  """A batch runs the filtering variant when any of its requests uses a filter: a seeded request that uses none must still draw the same
  tokens as in a batch that runs the plain one, so its text does not depend on its neighbours."""
  assert (draws(0.0) == draws(None)).all()

@pytest.mark.parametrize("vocab", [500, 512, 1000, 151936])
def test_greedy_is_numpys_argmax(vocab, chunk=128):
  """Greedy rows take the two-pass argmax (a row's chunks of 128 tokens, then the chunk holding the max): the first of equal maxima must
  still win, across chunk borders and in the padded last chunk, as numpy's (and greedy decoding's) argmax."""
  rng = np.random.default_rng(vocab)
  x = rng.integers(-3, 4, (6, vocab)).astype(np.float32)   # small integers: many ties
  x[1, :] = -np.inf   # a row with every token masked (a grammar that allows nothing) picks token 0, as numpy does
  x[2, vocab - 1] = 9.0   # the max alone in the padded last chunk
  x[3, [i for i in (chunk - 1, chunk, vocab - 1) if i < vocab]] = 9.0   # equal maxima at a chunk border and at the end: the first wins
  x[4] = rng.standard_normal(vocab).astype(np.float32)
  greedy = sample(Tensor(x), Tensor.zeros(6), Tensor.arange(6, dtype="int32"), Tensor.ones(6, dtype="int32"))
  assert greedy.numpy().tolist() == np.argmax(x, axis=1).tolist()
