"""Block manager: ref counts stay exact and no block is owned twice, whatever happens; prefix caching reuses physical blocks."""
from collections import Counter
from hypothesis import given, settings, strategies as st
from tinyvllm.block_manager import BlockManager
from tinyvllm.sequence import Sequence, SamplingParams

BS = 4

def admit(bm, seq):   # what the scheduler does on admission: the cached prefix counts as computed
  if (cached := bm.allocate(seq)) is not None: seq.num_computed_tokens = cached
  return cached is not None

def compute(bm, seq, n):   # what the engine does after a step computed n more tokens of seq
  bm.append(seq, n); seq.num_computed_tokens += n; bm.commit(seq)

def check_invariants(bm, live):
  owners = Counter(b for s in live for b in s.block_table)
  assert all(bm.ref[b] == owners[b] for b in range(bm.num_blocks))                       # ref counts are exact
  assert set(bm.free) == {b for b in range(bm.num_blocks) if bm.ref[b] == 0}             # free + used = total
  assert all(len(set(s.block_table)) == len(s.block_table) for s in live)               # no block twice in a table
  assert all(bm.cached[h] == b for b, h in bm.hash_of.items()) and len(bm.cached) == len(bm.hash_of)

ops = st.lists(st.tuples(st.sampled_from(["new", "grow", "free"]), st.integers(0, 10**6)), max_size=60)

@settings(max_examples=150, deadline=None)
@given(ops, st.booleans())
def test_refcounts_exact_after_any_operations(operations, caching):
  bm, live = BlockManager(24, BS, caching), []
  for op, r in operations:
    if op == "new":   # prompts from a tiny alphabet so prefixes repeat and the cache gets hits
      seq = Sequence("r", [r % 2] * (1 + r % 13), SamplingParams())
      if admit(bm, seq): live.append(seq); compute(bm, seq, len(seq) - seq.num_computed_tokens)
    elif live and op == "grow":
      seq = live[r % len(live)]; seq.token_ids.append(r % 3)
      if bm.append(seq, 1): compute(bm, seq, 1)
      else: seq.token_ids.pop()
    elif live and op == "free": bm.free_blocks(live.pop(r % len(live)))
    check_invariants(bm, live)
  for s in live: bm.free_blocks(s)
  assert len(bm.free) == bm.num_blocks

def test_prefix_hit_shares_the_same_physical_blocks():
  bm = BlockManager(16, BS)
  a = Sequence("a", list(range(10)), SamplingParams()); assert admit(bm, a); compute(bm, a, 10)
  b = Sequence("b", list(range(9)) + [99, 98], SamplingParams()); assert admit(bm, b)
  assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2] and b.num_computed_tokens == 8
  assert bm.ref[a.block_table[0]] == 2 and (bm.queries, bm.hits) == (10 + 11, 8)

def test_freed_cached_blocks_are_found_again_until_evicted():
  bm = BlockManager(4, BS)
  a = Sequence("a", list(range(9)), SamplingParams()); assert admit(bm, a); compute(bm, a, 9); bm.free_blocks(a)
  again = Sequence("a2", list(range(9)), SamplingParams()); assert admit(bm, again)
  assert again.num_computed_tokens == 8; bm.free_blocks(again)
  other = Sequence("o", [7] * 16, SamplingParams()); assert admit(bm, other); compute(bm, other, 16)   # needs every block: evicts
  bm.free_blocks(other); a3 = Sequence("a3", list(range(9)), SamplingParams())
  assert admit(bm, a3) and a3.num_computed_tokens == 0 and bm.hits == 8

def test_whole_prompt_in_cache_still_computes_its_last_token():
  bm = BlockManager(8, BS)
  a = Sequence("a", list(range(8)), SamplingParams()); assert admit(bm, a); compute(bm, a, 8)
  b = Sequence("b", list(range(8)), SamplingParams()); assert admit(bm, b)
  assert b.num_computed_tokens == 4 and b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]
