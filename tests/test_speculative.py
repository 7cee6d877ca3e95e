"""Speculative decoding (n-gram prompt lookup) changes no output: sampling is a pure function of (seed, position, logits), so verifying a
draft samples exactly the token a plain decode would. The same requests run with and without it on one engine with a small KV pool
(preemption, prefix caching, n > 1, stop strings, max_tokens); a scheduler-level test follows one verification and its rollback."""
import numpy as np, pytest
from tinyvllm import LLM, SamplingParams
from tinyvllm.block_manager import BlockManager
from tinyvllm.config import BUNDLED_MODEL, Config
from tinyvllm.scheduler import Scheduler, propose_ngram
from tinyvllm.sequence import Sequence, Status
from tinyvllm.tokenizer import Tokenizer

STORIES = ["Once upon a time, there was a little girl named Lily. She liked to play. Once upon a time, there was a little girl named",
           "The cat sat on the mat. The cat sat on the mat. The cat sat on the", "Tom and Sue went to the park. Tom and Sue",
           "One day, a big dog saw a ball. The dog wanted the ball. One day, a big dog", "Lily and Tom went to the park",
           "The little dog", "Once upon a time", "Ben had a red car. He loved his red car. Ben had a red"]

def requests(tokenizer, temperature):
  """~50 requests: story prompts (several of them repetitive, so drafts get accepted) and random token ids, with stop strings, logprobs,
  max_tokens cut-offs, n > 1 and ignore_eos, each with its own seed so that both runs sample from the same noise."""
  rng = np.random.default_rng(0)
  prompts = [tokenizer.encode(s) for s in STORIES * 4] + [[1] + rng.integers(3, 512, int(rng.integers(1, 90))).tolist() for _ in range(18)]
  params = [SamplingParams(temperature=temperature, seed=i, max_tokens=int(rng.integers(1, 70)), n=1 + (i % 9 == 4) * 2,
                           stop=[" the", "Lily."][i % 2] if i % 5 == 1 else None, include_stop_str_in_output=i % 10 == 6,
                           ignore_eos=i % 3 == 0, logprobs=2 if i % 7 == 3 else None) for i in range(len(prompts))]
  return prompts, params

@pytest.fixture(scope="module")
def llm():   # 32 blocks of 16 tokens (2 x 5 layers x 16 slots x 4 KV heads x 8 dims x fp32) for 8 sequences of up to ~160: preemptions
  return LLM(max_num_seqs=8, max_num_batched_tokens=64, speculative_ngram=4, kv_cache_memory=32.5 * 2*5*16*4*8*4 / 1e9)

def run(llm, prompts, params, k):
  llm.engine.config.speculative_ngram = k   # the scheduler reads it each step: off is the plain path, with the same graphs
  outs = llm.generate(prompts, params, use_tqdm=False)
  bm = llm.engine.block_manager
  assert bm.num_free == bm.num_blocks and not llm.engine.has_unfinished()   # no block leaked, rolled back or not
  # logprobs come from each verified position's own row (a draft's logits come from a wider step than a decode's: compared to 1e-4)
  return [[(o.token_ids, o.text, o.finish_reason, o.stop_reason, o.logprobs and [{t: Approx(lp.logprob) for t, lp in d.items()} for d in o.logprobs])
           for o in out.outputs] for out in outs]

class Approx(float):
  def __eq__(self, other): return abs(self - other) <= 1e-4

@pytest.mark.parametrize("temperature", [0, 0.8])
def test_speculation_changes_no_output(llm, temperature):
  prompts, params = requests(llm.engine.tokenizer, temperature)
  sch = llm.engine.scheduler
  counts = lambda: np.array([sch.num_drafts, sch.num_draft_tokens, sch.num_accepted_tokens, sch.num_preemptions])
  before = counts(); fast = run(llm, prompts, params, 4)
  drafts, draft_tokens, accepted, preemptions = counts() - before
  assert accepted > 0 and preemptions > 0 and draft_tokens <= 4 * drafts
  # the plain run reads blocks the speculative one registered in the prefix cache: none may hold a rejected draft's KV
  plain = run(llm, prompts, params, 0)
  assert fast == plain and run(llm, prompts, params, 4) == plain   # and the other way round
  assert any(out[0][2] == "stop" and out[0][3] in (" the", "Lily.") for out in plain) and any(len(out) == 3 for out in plain)   # n = 3

def test_ngram_proposer():
  assert propose_ngram([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 2) == [7, 8]        # the latest occurrence of the longest n-gram
  assert propose_ngram([5, 2, 3, 4, 6, 2, 3, 4], 3) == [6, 2, 3]                 # 3-gram [2, 3, 4]; the suffix itself is no match
  assert propose_ngram([1, 2, 1, 2, 1], 4) == [2, 1]                           # cut at the end of the tokens
  assert propose_ngram([1, 2, 3, 4], 4) == [] and propose_ngram([7], 4) == []   # unigrams are no evidence

def rows(*tokens): return np.array(tokens).reshape(-1, 1)   # the sampler's rows without logprobs: the token alone

def verifying(max_tokens=20):
  """A scheduler whose one sequence has drafts in flight: its prompt repeats [1..5], so after the 4 it samples first the n-gram
  [1, 2, 3, 4] proposes [5, 1, 2, 3]."""
  bm, tokenizer = BlockManager(16, 4), Tokenizer(BUNDLED_MODEL)
  sch = Scheduler(Config(max_num_batched_tokens=64, max_num_seqs=8, block_size=4, max_model_len=64, speculative_ngram=4), bm, set())
  seq = Sequence("a", [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3], SamplingParams(max_tokens=max_tokens))
  seq.detok = tokenizer.detokenizer(seq.token_ids)
  sch.waiting.append(seq)
  sch.advance(sch.schedule())                        # the prompt, launched: its first token is a placeholder
  assert sch.schedule() == []                        # the known tokens would propose: it waits for the token the GPU is drawing
  sch.postprocess(sch.receive([seq], rows(4)))
  batch = sch.schedule()                             # [..., 1, 2, 3, 4] occurred before: the 4 tokens after it are its drafts
  assert batch == [(seq, 5)] and seq.drafts == [5, 1, 2, 3] and len(seq.block_table) == 5
  sch.advance(batch)                                 # only the verified token counts as computed; blocks with drafts stay unregistered
  assert seq.num_computed_tokens == 14 and seq.token_ids[-2:] == [4, -1] and len(seq.block_hashes) == 3
  assert sch.schedule() == []                        # while its drafts are verified, where it goes on is unknown
  return sch, bm, seq

def test_verification_keeps_drafts_up_to_the_first_wrong_one_and_gives_back_its_blocks():
  sch, bm, seq = verifying()
  kept = sch.receive([seq] * 5, rows(5, 1, 9, 7, 7))     # drafts 5 and 1 sampled again, then 9 where the draft said 2: the rest is dropped
  assert [(row[0], length) for _, row, length in kept] == [(5, 15), (1, 16), (9, 17)] and seq.drafts == []
  assert seq.token_ids[13:] == [4, 5, 1, 9] and seq.num_computed_tokens == 16 and len(seq.block_table) == 4 and bm.num_free == 12
  assert [out.token_ids for _, out in sch.postprocess(kept)] == [[5], [1], [9]]
  assert (sch.num_drafts, sch.num_draft_tokens, sch.num_accepted_tokens) == (1, 4, 2)
  assert sch.schedule() == [(seq, 1)] and seq.drafts == []   # [.., 1, 9] never occurred before: a plain decode

def test_a_verification_stops_where_a_plain_decode_would():
  sch, bm, seq = verifying(max_tokens=3)
  outputs = sch.postprocess(sch.receive([seq] * 5, rows(5, 1, 2, 3, 8)))   # every draft right, but only 2 more tokens are allowed
  assert [(out.token_ids, out.finish_reason) for _, out in outputs] == [([5], None), ([1], "length")]
  assert seq.token_ids[13:] == [4, 5, 1] and seq.status == Status.FINISHED and bm.num_free == 16
  sch, bm, seq = verifying()
  sch.preempt(seq)                                   # preempted while verifying: the drafts are dropped, the first token stands
  assert [row[0] for _, row, _ in sch.receive([seq] * 5, rows(5, 1, 2, 3, 8))] == [5] and seq.token_ids[13:] == [4, 5]
  assert seq.num_computed_tokens == 0 and bm.num_free == 16 and sch.schedule() == [(seq, 3)]   # its 3 verified blocks are cached
