"""Paged KV cache (vLLM's PagedAttention): the slot-major KV pool write and attention over block tables.

The pool is (num_slots, KVH, D) with slot = block*block_size + offset, the layout of vLLM's `reshape_and_cache`. One attention call serves a
whole mixed step: every query token (decode or prefill chunk) carries the block-table row of its sequence and how many cached positions it
may see, so causal masking inside a prefill chunk falls out of ctx_lens (as in vLLM's flattened varlen batches)."""
import math, functools
from tinygrad import Tensor, UOp, dtypes, Device
from tinygrad.uop.ops import KernelInfo, AxisType, Ops
from tinygrad.dtype import AddrSpace
from tinygrad.renderer import Estimates

def _kv_write_kernel(KP:UOp, VP:UOp, SL:UOp, K:UOp, V:UOp) -> UOp:
  # vLLM's reshape_and_cache: pool[slots[n]] = kv[n] for both pools in one launch; O(N) work, slot -1 (padding row) is skipped
  n, h, d = UOp.range(K.shape[0], 0), UOp.range(K.shape[1], 1), UOp.range(K.shape[2], 2)
  s = SL[n].cast(dtypes.weakint)
  s = s.valid((s >= 0) & (s < KP.shape[0]))   # out-of-pool slots are skipped too: the bound also lets tinygrad drop index wrapping
  return UOp.group(KP[s, h, d].store(K[n, h, d].cast(KP.dtype)), VP[s, h, d].store(V[n, h, d].cast(VP.dtype))).end(n, h, d) \
    .sink(arg=KernelInfo(name="kv_write"))

def kv_write(k_pool:Tensor, v_pool:Tensor, slots:Tensor, k:Tensor, v:Tensor) -> tuple[Tensor, Tensor]:
  """Write k, v (N, KVH, D) into the pools at slots (N,) int32 in place; -1 = padding row. Returns the pools after the write."""
  kp, vp, *_ = k_pool.custom_kernel(v_pool, slots, k, v, fxn=_kv_write_kernel)
  return kp, vp

def _paged_attention_kernel(O:UOp, Q:UOp, KP:UOp, VP:UOp, BT:UOp, TS:UOp, L:UOp, block_size:int, has_local:bool) -> UOp:
  # one thread per (query token n, head h) walks its sequence's positions once with an online softmax (FlashAttention / vLLM's
  # paged_attention_v1): the q.k score is computed once per (n, h, t); the D-wide output accumulator is an UPCAST register array.
  (N, H, D), (NS, KVH, _), (S, MAXB) = O.shape, KP.shape, BT.shape
  G, f32 = H // KVH, dtypes.float
  # GPU: a workgroup per query token, a thread per head (same trip count in the group, GQA heads share K/V rows in cache).
  # CPU: only one GLOBAL axis and no LOCAL axes are allowed, so heads become a plain loop.
  n, h = UOp.range(N, 0, AxisType.GLOBAL), UOp.range(H, 1, AxisType.LOCAL if has_local else AxisType.LOOP)
  k, d, d2 = UOp.range(D, 3, AxisType.UNROLL), UOp.range(D, 4, AxisType.UPCAST), UOp.range(D, 5, AxisType.UPCAST)
  # the loop runs exactly ctx_len times (data-dependent trip count, no masked iterations); clamping the loaded ints proves every index in
  # bounds, which keeps garbage inputs from reading out of the pool and lets tinygrad drop its index wrapping (% on every load)
  seq = TS[n].maximum(0).minimum(S-1).cast(dtypes.weakint)
  t = UOp.range(L[n].maximum(1).minimum(MAXB*block_size).cast(dtypes.weakint), 2, AxisType.REDUCE)
  slot = BT[seq, t // block_size].maximum(0).minimum(NS//block_size - 1).cast(dtypes.weakint) * block_size + t % block_size  # page table
  score = (Q[n, h, k].cast(f32) * KP[slot, h // G, k].cast(f32)).reduce(k, arg=Ops.ADD) * (1 / math.sqrt(D))
  # online-softmax state in registers: running max m, running denominator l, unnormalized output acc[D]; (re)initialized per (n, h)
  m = UOp.placeholder((1,), f32, 0, addrspace=AddrSpace.REG).after(n, h)[0].set(-math.inf)
  l = UOp.placeholder((1,), f32, 1, addrspace=AddrSpace.REG).after(n, h)[0].set(0.0)
  acc = UOp.placeholder((D,), f32, 2, addrspace=AddrSpace.REG).after(n, h)[d].set(0.0, end=d)
  pm, pl = m.after(t)[0], l.after(t)[0]
  m_new = pm.maximum(score)
  alpha, p = (pm - m_new).exp(), (score - m_new).exp()   # rescale of the old state, weight of position t
  upd = UOp.group(m[0].store(m_new), l[0].store(pl * alpha + p),
                  acc[d2].store(acc.after(t)[d2] * alpha + p * VP[slot, h // G, d2].cast(f32)).end(d2)).end(t)
  out = O[n, h, d].store((acc.after(upd)[d] / l.after(upd)[0]).cast(O.dtype)).end(d).end(h, n)
  # tag=1 marks the AST as already optimized: tinygrad's range optimizer leaves our hand-placed axes and register state alone, and our
  # (empty) estimates are kept, as the data-dependent trip count can't be counted statically (the stats code would crash on it)
  return out.sink(arg=KernelInfo(name="paged_attention", opts_to_apply=(), estimates=Estimates()), tag=1)

def paged_attention(q:Tensor, k_pool:Tensor, v_pool:Tensor, block_tables:Tensor, token_seq:Tensor, ctx_lens:Tensor, block_size:int,
                    use_kernel:bool) -> Tensor:
  """q (N, H, D) -> (N, H, D): token n attends to positions 0..ctx_lens[n]-1 of sequence token_seq[n], found through block_tables (S, MAXB)."""
  (N, H, D), KVH = q.shape, k_pool.shape[1]
  assert H % KVH == 0, f"GQA needs H={H} to be a multiple of KVH={KVH}"
  if use_kernel:
    fxn = functools.partial(_paged_attention_kernel, block_size=block_size, has_local=Device[q.device].renderer.has_local)
    out = Tensor.empty(N, H, D, dtype=q.dtype, device=q.device)
    return out.custom_kernel(q, k_pool, v_pool, block_tables, token_seq, ctx_lens, fxn=fxn)[0]
  # portable reference: gather each token's slot ids from its block-table row, mask positions >= ctx_len, plain SDPA in float32
  T = block_tables.shape[1] * block_size
  slots = (block_tables[token_seq] * block_size).reshape(N, -1, 1) + Tensor.arange(block_size).to(q.device).reshape(1, 1, block_size)
  k, v = (pool[slots.reshape(N, T)].float().transpose(1, 2) for pool in (k_pool, v_pool))   # (N, KVH, T, D)
  mask = (Tensor.arange(T).to(q.device).reshape(1, T) < ctx_lens.reshape(N, 1)).reshape(N, 1, 1, T)
  out = q.float().reshape(N, H, 1, D).scaled_dot_product_attention(k, v, attn_mask=mask, enable_gqa=True)
  return out.reshape(N, H, D).cast(q.dtype)
