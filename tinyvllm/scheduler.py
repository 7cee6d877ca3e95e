"""The scheduler, called by llm_engine each step: which sequences run and how many new tokens of each (continuous batching, chunked
prefill, preemption), then the host side of the tokens they sample (placeholders, grammar state); llm_engine turns those tokens into
text and stops them. It takes KV blocks from block_manager and never touches the device: model_runner computes what it schedules."""
import collections
from tinyvllm.config import Config
from tinyvllm.sequence import Sequence, Status
from tinyvllm.block_manager import BlockManager

class Scheduler:
  """Continuous batching: every step fills a token budget, running sequences first (decodes and unfinished prompt chunks), then new
  prompts in arrival order, chunked so a long prompt never stalls the decodes. When blocks run out, the most recently admitted sequence is
  preempted: its blocks are freed and it is recomputed later (prefix caching usually makes that cheap). A step's bookkeeping is split
  around the GPU, as in vLLM's async scheduling; the methods below come in the order LLMEngine.step calls them: `schedule` the next
  step, `receive` the tokens of the one before (once the next step is launched, or just before where it cannot run ahead), `advance`
  right after the next step's launch (after the engine's process_output has finished the sequences those tokens stopped), and `finish`."""
  def __init__(self, config:Config, block_manager:BlockManager):
    # running in admission order: the last one is the first to be preempted
    self.config, self.bm, self.waiting, self.running, self.num_preemptions = config, block_manager, collections.deque(), [], 0

  def schedule(self, max_step_tokens:float=float("inf")) -> list[tuple[Sequence, int]]:
    """Returns (sequence, num_new: how many of its tokens to compute this step); a sequence whose last token is computed samples one
    more. max_step_tokens: the largest step the runner has a graph for yet, if under the configured budget."""
    budget, batch = min(max_step_tokens, self.config.max_num_batched_tokens), []
    # the live list: a sequence preempted below leaves it from the end, behind this loop (running stays a prefix of what it was), so the
    # loop stops before it and meets only running sequences
    for seq in self.running:
      if (num_new := min(len(seq) - seq.num_computed_tokens, budget)) == 0: break
      # out of blocks: the most recently admitted sequence (maybe this one) is preempted: its blocks are freed, and it goes back to the
      # front of the queue, to be recomputed
      while seq.status == Status.RUNNING and not self.bm.append(seq, num_new):
        victim = self.running.pop(); self.bm.free_blocks(victim); self.waiting.appendleft(victim)
        victim.status, victim.num_computed_tokens, self.num_preemptions = Status.WAITING, 0, self.num_preemptions + 1
      if seq.status == Status.RUNNING: batch.append((seq, num_new)); budget -= num_new
    while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
      # its cached prefix counts as computed
      seq, num_cached = self.waiting[0], self.bm.allocate(self.waiting[0])
      if num_cached is None: break
      self.waiting.popleft(); self.running.append(seq); seq.status, seq.num_computed_tokens = Status.RUNNING, num_cached
      batch.append((seq, num_new := min(len(seq) - seq.num_computed_tokens, budget))); budget -= num_new
    return batch

  def receive(self, sampling:list[Sequence], tokens:list[int]) -> list[tuple[Sequence, int, int]]:
    """A step's tokens (one for each of its sampling sequences) replace their placeholders (the next step, launched ahead, read them on
    the device; one that cannot run ahead, after this, for its grammars' masks). Returns (sequence, token, its length with the token) for
    each token kept."""
    # not a sequence the step before stopped
    kept = [(seq, int(token), len(seq)) for seq, token in zip(sampling, tokens) if seq.status != Status.FINISHED and seq.token_ids[-1] < 0]
    for seq, token, _ in kept: seq.token_ids[-1] = token; seq.matcher and seq.matcher.consume_token(token)
    return kept

  def advance(self, batch:list[tuple[Sequence, int]], sampling:list[Sequence]):
    """Right after a step's launch, before its tokens exist: its tokens count as computed, and each sequence that samples (sampling, by
    row) holds a placeholder for the token the GPU is drawing, -1 - its row, so the next step can be scheduled and launched now (vLLM's
    async scheduling: that step reads the token from the row on the device)."""
    # the sequences still running: not one the previous step's token stopped
    for seq, num_new in ((seq, num_new) for seq, num_new in batch if seq.status == Status.RUNNING):
      # full blocks are registered for prefix caching
      seq.num_computed_tokens += num_new; self.bm.commit(seq)
    # (a mid-prompt chunk samples nothing)
    for row, seq in ((r, s) for r, s in enumerate(sampling) if s.status == Status.RUNNING): seq.token_ids.append(-1 - row)

  def finish(self, seq:Sequence):
    if seq.status == Status.RUNNING: self.bm.free_blocks(seq); self.running.remove(seq)
    elif seq in self.waiting: self.waiting.remove(seq)
    seq.status = Status.FINISHED
