from collections import deque
from tinyvllm.config import Config
from tinyvllm.sequence import Sequence, Status
from tinyvllm.block_manager import BlockManager

class Scheduler:
  """Continuous batching: every step fills a token budget, running sequences first (decodes and unfinished prompt chunks), then new
  prompts in arrival order, chunked so a long prompt never stalls the decodes. When blocks run out, the most recently admitted sequence is
  preempted: its blocks are freed and it is recomputed later (prefix caching usually makes that cheap)."""
  def __init__(self, config:Config, block_manager:BlockManager):
    self.config, self.bm = config, block_manager
    self.waiting: deque[Sequence] = deque()
    self.running: list[Sequence] = []        # admission order: the last one is the first to be preempted
    self.num_preemptions = 0

  def schedule(self) -> list[tuple[Sequence, int]]:
    """Returns (sequence, number of its tokens to compute this step); a sequence whose last token is computed samples one more."""
    budget, batch = self.config.max_num_batched_tokens, []
    for seq in list(self.running):
      if seq.status != Status.RUNNING: continue            # preempted below while making room for an earlier sequence
      if (n := min(len(seq) - seq.num_computed_tokens, budget)) == 0: break
      while not self.bm.can_append(seq, n) and seq.status == Status.RUNNING: self.preempt(self.running[-1])
      if seq.status == Status.RUNNING: self.bm.append(seq, n); batch.append((seq, n)); budget -= n
    while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
      seq, parent = self.waiting[0], self.waiting[0].parent
      if parent is not None and parent.status != Status.FINISHED and parent.num_computed_tokens < parent.num_prompt_tokens: break
      # n > 1: a forked sibling shares its parent's full prompt blocks (copy-free fork), whatever the prefix cache holds
      shared = parent.block_table[:(min(parent.num_computed_tokens, len(seq)) - 1) // self.bm.block_size] if parent and parent.block_table else None
      if not self.bm.allocate(seq, shared): break
      self.waiting.popleft(); self.running.append(seq); seq.status = Status.RUNNING
      batch.append((seq, n := min(len(seq) - seq.num_computed_tokens, budget))); budget -= n
    return batch

  def preempt(self, seq:Sequence):
    self.bm.free_blocks(seq); self.running.remove(seq); self.waiting.appendleft(seq)
    seq.status, self.num_preemptions = Status.WAITING, self.num_preemptions + 1

  def finish(self, seq:Sequence, reason:str):
    if seq.status == Status.RUNNING: self.bm.free_blocks(seq); self.running.remove(seq)
    elif seq in self.waiting: self.waiting.remove(seq)
    seq.status, seq.finish_reason = Status.FINISHED, reason
