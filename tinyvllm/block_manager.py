"""KV blocks as bookkeeping: which blocks of model_runner's KV pool each sequence holds (its block table), and prefix caching. Only the
scheduler calls it; it writes the sequences' block tables and block hashes (how many tokens are computed is the scheduler's to
write), and never touches the pool itself."""
import collections, hashlib, itertools
from tinyvllm.sequence import Sequence

# a full block's identity chains over everything before it, so equal hashes mean equal prefixes (sha256: collisions can't mix up outputs)
def block_hash(prev:bytes, tokens:list[int]) -> bytes: return hashlib.sha256(prev + b"".join(t.to_bytes(4, "little") for t in tokens)).digest()

class BlockManager:
  """KV memory as virtual memory: fixed-size physical blocks, a free list, reference counts and one block table per sequence.
  Prefix caching: a full block's KV is registered under its chained hash; a later prompt with the same prefix shares the block (ref count up)
  and skips its prefill. Freed cached blocks stay findable on the free list until they are reused, least recently freed first."""
  def __init__(self, num_blocks:int, block_size:int, enable_prefix_caching:bool=True):
    # ref: each physical block's reference count; free: the blocks no sequence holds, front = next to be reused; cached: hash -> physical
    # block holding that prefix's KV; hash_of: physical block -> its hash, to unregister it when the block is reused; queries / hits: prompt
    # tokens looked up / found in the cache
    self.num_blocks, self.block_size, self.caching, self.queries, self.hits = num_blocks, block_size, enable_prefix_caching, 0, 0
    self.ref, self.free, self.cached, self.hash_of = [0] * num_blocks, collections.OrderedDict.fromkeys(range(num_blocks)), {}, {}

  def _take(self) -> int:
    # the front free block; the prefix it held, if any (the least recently used one), leaves the cache
    b, _ = self.free.popitem(last=False); self.cached.pop(self.hash_of.pop(b, None), None)
    self.ref[b] = 1; return b

  def allocate(self, seq:Sequence) -> int | None:
    """Admit seq: share its cached prefix (the cached blocks matching its start; the last token is always left to compute, since its
    logits are needed), and take fresh blocks for the rest of its tokens. Returns how many of its tokens the shared blocks hold (the
    scheduler counts them as computed), or None, taking nothing, if its blocks don't fit."""
    chunks = (seq.token_ids[j*self.block_size:(j+1)*self.block_size] for j in range((len(seq) - 1) // self.block_size if self.caching else 0))
    # each full block's chained hash, lazily, up to the first block not cached
    hashes = itertools.islice(itertools.accumulate(chunks, block_hash, initial=b""), 1, None)
    shared = list(itertools.takewhile(lambda b: b is not None, map(self.cached.get, hashes)))
    need = -(-len(seq) // self.block_size) - len(shared)
    if need + sum(self.ref[b] == 0 for b in shared) > len(self.free): return None
    for b in shared: self.free.pop(b, None); self.ref[b] += 1
    seq.block_table, cached = shared + [self._take() for _ in range(need)], len(shared) * self.block_size
    seq.block_hashes = [self.hash_of[b] for b in shared]
    self.queries, self.hits = self.queries + len(seq), self.hits + cached; return cached

  def append(self, seq:Sequence, num_new:int) -> bool:
    """Grow the block table on demand so the next num_new tokens have slots; False, taking nothing, if too few blocks are free."""
    if (need := -(-(seq.num_computed_tokens + num_new) // self.block_size) - len(seq.block_table)) > len(self.free): return False
    seq.block_table += [self._take() for _ in range(need)]; return True

  def commit(self, seq:Sequence):
    """Register blocks that became full this step; only now is their KV in the pool, so only now may others share them."""
    for j in range(len(seq.block_hashes), seq.num_computed_tokens // self.block_size if self.caching else 0):
      seq.block_hashes.append(h := block_hash(seq.block_hashes[-1] if j else b"", seq.token_ids[j*self.block_size:(j+1)*self.block_size]))
      if h not in self.cached: self.cached[h], self.hash_of[seq.block_table[j]] = seq.block_table[j], h

  def free_blocks(self, seq:Sequence):
    # a sequence's tail is the least likely to be shared again, so it is reused first
    for b in reversed(seq.block_table):
      # a freed block goes to the back of the free list if it is cached, to the front if not (reused first)
      self.ref[b] -= 1
      if self.ref[b] == 0: self.free[b] = None; self.free.move_to_end(b, last=b in self.hash_of)
    seq.block_table = []
