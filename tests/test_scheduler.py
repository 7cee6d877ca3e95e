"""Scheduler rules on their own: decodes first, prompts chunked to the token budget, preemption of the newest sequence, and async
scheduling's bookkeeping around a step whose tokens are still on the GPU, with a real engine's output processing (the bundled model)."""
import numpy as np
from tinyvllm.block_manager import BlockManager
from tinyvllm.config import Config
from tinyvllm.scheduler import Scheduler
from tinyvllm.llm_engine import LLMEngine
from tinyvllm.sequence import Sequence, SamplingParams, Status

def engine_step(sch, batch):   # what the engine does with a batch: compute the tokens, sample one for sequences whose prompt is done
  for seq, n in batch:
    seq.num_computed_tokens += n
    if seq.num_computed_tokens == len(seq): seq.token_ids.append(7)

def test_decodes_first_then_chunked_prompts_within_budget():
  sch = Scheduler(Config(max_num_batched_tokens=32, max_num_seqs=8, block_size=4), BlockManager(64, 4))
  short, long = Sequence("a", [1] * 5, SamplingParams()), Sequence("b", list(range(70)), SamplingParams())
  sch.waiting.extend([short, long])
  first = sch.schedule()
  assert [(s.request_id, n) for s, n in first] == [("a", 5), ("b", 27)]            # FCFS admission, the long prompt gets the rest
  engine_step(sch, first)
  second = sch.schedule()
  assert [(s.request_id, n) for s, n in second] == [("a", 1), ("b", 31)]           # the decode goes first, the prompt chunk fills up
  engine_step(sch, second); engine_step(sch, sch.schedule())
  assert long.num_computed_tokens == 70 and len(long) == 71                         # 27 + 31 + 12: prompt done, first token sampled

def test_out_of_blocks_preempts_the_newest_and_recomputes_it():
  bm = BlockManager(6, 4)
  sch = Scheduler(Config(max_num_batched_tokens=64, max_num_seqs=8, block_size=4), bm)
  old, new = Sequence("old", [1] * 12, SamplingParams()), Sequence("new", [2] * 12, SamplingParams())
  sch.waiting.extend([old, new])
  engine_step(sch, sch.schedule())                     # 3 + 3 blocks: the pool is full, both hold 13 tokens
  batch = sch.schedule()                               # old needs a 4th block: new is preempted, its blocks freed
  assert [s.request_id for s, _ in batch] == ["old"] and new.status == Status.WAITING and new.num_computed_tokens == 0
  assert sch.num_preemptions == 1 and list(sch.waiting) == [new] and len(bm.free) == 6 - 4
  sch.finish(old)
  batch = sch.schedule()                               # readmitted: recomputes its prompt and the token it had sampled
  assert [(s.request_id, n) for s, n in batch] == [("new", 13)] and len(bm.free) == 6 - 4

def test_the_next_step_is_scheduled_before_the_sampled_tokens_arrive():
  """advance() runs right after a launch: each sampling sequence holds a placeholder, -1 - its row in the step's sampled tokens (where the
  next step's graph reads it on the device), so the next step schedules its decode at once. receive() puts the real token in. A sequence the late token stops has run once more for nothing:
  advance() skips it and its blocks are already back."""
  config = Config(max_num_batched_tokens=64, max_num_seqs=8, block_size=4, max_model_len=64, enforce_eager=True)
  # the engine's output processing runs on a real engine (the bundled model), its scheduler this test's over a pool of 16 blocks
  engine, bm = LLMEngine(config), BlockManager(16, 4)
  sch, tokenizer = Scheduler(engine.config, bm), engine.tokenizer
  a, b = Sequence("a", [1] * 6, SamplingParams(max_tokens=1)), Sequence("b", [1] * 3, SamplingParams(max_tokens=5))
  for seq in (a, b): seq.detok = tokenizer.detokenizer(seq.token_ids)
  sch.waiting.extend([a, b])
  first = sch.schedule()
  sch.advance(first, [a, b])                           # launched: the prompts count as computed, their tokens are not known yet
  assert a.token_ids == [1] * 6 + [-1] and b.token_ids == [1] * 3 + [-2] and (a.num_computed_tokens, b.num_computed_tokens) == (6, 3)
  second = sch.schedule()                              # the decodes of the unknown tokens, scheduled before they arrive
  assert [(s.request_id, n) for s, n in second] == [("a", 1), ("b", 1)]
  kept = sch.receive([a, b], np.array([300, 301]))  # step one's tokens, before step two's launch reads them
  assert a.token_ids[-1] == 300 and b.token_ids == [1, 1, 1, 301]
  # while step two runs, the engine's output processing: a has its one token
  engine.scheduler, engine.requests = sch, {"a": a, "b": b}
  outputs = [engine.process_output(seq, token, n) for seq, token, n in kept]
  assert [(o.request_id, o.outputs[0].token_ids, o.outputs[0].finish_reason, o.finished) for o in outputs] == [("a", [300], "length", True),
                                                                                                              ("b", [301], None, False)]
  assert list(engine.requests) == ["b"]   # a finished request leaves the engine
  assert a.status == Status.FINISHED and len(bm.free) == 16 - 1
  sch.advance(second, [a, b])                          # a ran for nothing: skipped; b holds a placeholder again (row 1)
  assert a.num_computed_tokens == 6 and b.num_computed_tokens == 4 and b.token_ids[-1] == -2
  assert [(s.request_id, n) for s, n in sch.schedule()] == [("b", 1)] and len(bm.free) == 16 - 2
