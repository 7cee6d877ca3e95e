"""Paged KV cache (vLLM's PagedAttention): the slot-major KV pool write and attention over block tables.

The pool is (num_slots, KVH, D) with slot = block*block_size + offset, the layout of vLLM's `reshape_and_cache`. One attention call serves a
whole mixed step: every query token (decode or prefill chunk) carries the block-table row of its sequence and its position, so causal
masking inside a prefill chunk falls out of the positions (as in vLLM's flattened varlen batches)."""
import math, functools
from tinygrad import Tensor, UOp, dtypes, Device
from tinygrad.uop.ops import KernelInfo, AxisType, Ops
from tinygrad.dtype import AddrSpace
from tinygrad.renderer import Estimates

DENSE_MIN, DENSE_MAX = 512, 2048   # step sizes whose in-step attention is a dense (N, N) matmul (measured on an H200, see BENCHMARKS.md)

def _kv_write_kernel(KP:UOp, VP:UOp, SL:UOp, K:UOp, V:UOp) -> UOp:
  # vLLM's reshape_and_cache: pool[slots[n]] = kv[n] for both pools in one launch; O(N) work, slot -1 (padding row) is skipped
  n, h, w = UOp.range(K.shape[0], 0), UOp.range(K.shape[1], 1), UOp.range(KP.shape[2], 2)
  # out-of-pool slots are skipped too: the bound also lets tinygrad drop index wrapping
  s = (s := SL[n].cast(dtypes.weakint)).valid((s >= 0) & (s < KP.shape[0]))
  bits = lambda X, i: X[n, h, i].bitcast(dtypes.uint16).cast(dtypes.uint32)
  word = lambda X: X[n, h, w].cast(KP.dtype) if KP.shape[2] == X.shape[2] else bits(X, 2*w) | bits(X, 2*w + 1) << 16   # see words
  return UOp.group(KP[s, h, w].store(word(K)), VP[s, h, w].store(word(V))).end(n, h, w).sink(arg=KernelInfo(name="kv_write"))

# 16-bit pools hold 32-bit words of two elements each, as tinygrad widens uint loads to 16 bytes and leaves bf16 ones scalar
words = lambda x: x.bitcast(dtypes.uint32) if x.dtype.itemsize == 2 else x

def kv_write(k_pool:Tensor, v_pool:Tensor, slots:Tensor, k:Tensor, v:Tensor) -> tuple[Tensor, Tensor]:
  """Write k, v (N, KVH, D) into the pools (words(...) of (num_slots, KVH, D)) at slots (N,) int32 in place; -1 = padding row.
  Returns the pools after the write."""
  return tuple(k_pool.custom_kernel(v_pool, slots, k, v, fxn=_kv_write_kernel)[:2])

def _paged_attention_kernel(OUT:UOp, Q:UOp, KP:UOp, VP:UOp, BT:UOp, TS:UOp, L:UOp, block_size:int, has_local:bool) -> UOp:
  # flash-decoding (vLLM's paged_attention_v2): each query token's context is split into C equal chunks, and one thread per
  # (token n, head h, chunk c) walks its chunk once with an online softmax; q.k is computed once per (n, h, t) and the D-wide output
  # accumulator is an UPCAST register array. The partial (m, l, acc) of the chunks are merged afterwards with plain tinygrad ops.
  (N, H, C, _), (NS, KVH, W), (S, MAXB), D = OUT.shape, KP.shape, BT.shape, Q.shape[2]   # OUT[..., :D] = acc, [D] = m, [D+1] = l
  G, f32 = H // KVH, dtypes.float
  # GPU: a workgroup per (token, chunk), a thread per head (GQA heads share K/V rows in cache). CPU: one GLOBAL axis, no LOCAL axes.
  n, c = UOp.range(N, 0, AxisType.GLOBAL), UOp.range(C, 1, AxisType.GLOBAL if has_local else AxisType.LOOP)
  h = UOp.range(H, 2, AxisType.LOCAL if has_local else AxisType.LOOP)
  k, d, d2 = UOp.range(D, 4, AxisType.UNROLL), UOp.range(D, 5, AxisType.UPCAST), UOp.range(D, 6, AxisType.UPCAST)
  # clamping the loaded ints proves every index in bounds, which keeps garbage inputs from reading out of the pool and lets tinygrad
  # drop its index wrapping (% on every load); L[n] = positions to read (the cached prefix in dense steps, positions[n]+1 otherwise), so
  # the loop runs ceil(L[n] / C) times, a data-dependent trip count
  seq, ctx = TS[n].maximum(0).minimum(S-1).cast(dtypes.weakint), L[n].maximum(0).minimum(MAXB*block_size).cast(dtypes.weakint)
  t = UOp.range(chunk := (ctx + (C - 1)) // C, 3, AxisType.REDUCE)
  valid = c * chunk + t < ctx
  pos = (c * chunk + t).minimum(ctx - 1).maximum(0)   # L = 0 (nothing cached) runs no iterations
  slot = BT[seq, pos // block_size].maximum(0).minimum(NS//block_size - 1).cast(dtypes.weakint) * block_size + pos % block_size  # page table
  row = lambda P, d: (P[slot, h//G, d] if W == D else (P[slot, h//G, d//2] >> d%2*16).cast(dtypes.uint16).bitcast(Q.dtype)).cast(f32)   # see words
  score = (Q[n, h, k].cast(f32) * row(KP, k)).reduce(k, arg=Ops.ADD) * (1 / math.sqrt(D))
  # online-softmax state in registers: running max m, running denominator l, unnormalized output acc[D]; (re)initialized per (n, c, h)
  m = UOp.placeholder((1,), f32, 0, addrspace=AddrSpace.REG).after(n, c, h)[0].set(-math.inf)
  l = UOp.placeholder((1,), f32, 1, addrspace=AddrSpace.REG).after(n, c, h)[0].set(0.0)
  acc = UOp.placeholder((D,), f32, 2, addrspace=AddrSpace.REG).after(n, c, h)[d].set(0.0, end=d)
  pm, pl = m.after(t)[0], l.after(t)[0]
  m_new = valid.where(pm.maximum(score), pm)
  alpha, p = valid.where((pm - m_new).exp(), 1.0), valid.where((score - m_new).exp(), 0.0)   # rescale of the old state, weight of t
  upd = UOp.group(m[0].store(m_new), l[0].store(pl * alpha + p),
                  acc[d2].store(acc.after(t)[d2] * alpha + p * row(VP, d2)).end(d2)).end(t)
  out = UOp.group(OUT[n, h, c, d].store(acc.after(upd)[d]).end(d), OUT[n, h, c, D].store(m.after(upd)[0]), OUT[n, h, c, D+1].store(l.after(upd)[0]))
  # tag=1 marks the AST as already optimized: tinygrad's range optimizer leaves our hand-placed axes and register state alone, and our
  # (empty) estimates are kept, as the data-dependent trip count can't be counted statically (the stats code would crash on it)
  return out.end(h, c, n).sink(arg=KernelInfo(name="paged_attention", opts_to_apply=(), estimates=Estimates()), tag=1)

def in_step_attention(q:Tensor, k:Tensor, v:Tensor, token_seq:Tensor) -> tuple[Tensor, Tensor, Tensor]:
  """Softmax partials (m, l, acc) of each token over the step's own tokens of its sequence up to itself (causal), through batched matmuls that
  tinygrad runs on tensor cores. A prefill chunk is dense causal attention; the block-diagonal mask separates the step's sequences."""
  (N, H, D), KVH = q.shape, k.shape[1]
  s = q.reshape(N, KVH, H // KVH, D).permute(1, 2, 0, 3).matmul(k.permute(1, 2, 0).unsqueeze(1), dtype=dtypes.float) / math.sqrt(D)
  idx = Tensor.arange(N).to(q.device)
  s = ((token_seq.unsqueeze(1) == token_seq.unsqueeze(0)) & (idx.unsqueeze(0) <= idx.unsqueeze(1))).where(s, -math.inf)  # (KVH, G, N, N)
  m = s.max(-1, keepdim=True)
  p = (s - m).exp()
  # probabilities in 16 bits, as flash-attention does. acc gets its own buffer: fused into the merge in paged_attention, P x V became a kernel
  # with two reductions, which tinygrad runs without tensor cores (7x slower on an H200)
  acc = p.cast(q.dtype).matmul(v.permute(1, 0, 2).unsqueeze(1), dtype=dtypes.float).contiguous()
  to_nh = lambda t: t.permute(2, 0, 1, 3).reshape(N, H, t.shape[3])
  return to_nh(m)[..., 0], to_nh(p.sum(-1, keepdim=True))[..., 0], to_nh(acc)

def paged_attention(q:Tensor, k:Tensor, v:Tensor, k_pool:Tensor, v_pool:Tensor, block_tables:Tensor, token_seq:Tensor, positions:Tensor,
                    cached_lens:Tensor, block_size:int) -> Tensor:
  """q (N, H, D) -> (N, H, D): token n (at positions[n] of sequence token_seq[n], whose block_tables (S, MAXB) row maps positions to pool
  slots) attends to positions 0..positions[n]. The pools already hold this step's k, v (N, KVH, D); cached_lens[n] = how many of the
  sequence's positions came from earlier steps (the step's own tokens of a sequence are consecutive rows, as vLLM flattens varlen batches)."""
  (N, H, D), KVH, ctx_lens = q.shape, k_pool.shape[1], positions + 1
  assert H % KVH == 0, f"GQA needs H={H} to be a multiple of KVH={KVH}"
  # vLLM's split of prefill and decode attention: in prefill-sized steps the kernel reads only the cached prefix and the step's own tokens
  # meet through tensor-core matmuls. Smaller steps are mostly decodes (one in-step token each: the kernel alone is cheaper), and the
  # (N, N) scores of larger ones grow quadratically, so those read everything through the kernel.
  dense = DENSE_MIN <= N <= DENSE_MAX
  # enough chunks to fill the GPU at small batches, few enough that the partial results stay small for prefill-sized steps
  C, f32 = max(1, min(64, 1024 // N, -(-block_tables.shape[1] * block_size // 8))), dtypes.float
  fxn = functools.partial(_paged_attention_kernel, block_size=block_size, has_local=Device[q.device].renderer.has_local)
  # with a one-row table token_seq is provably 0 and tinygrad drops it from the kernel's parameters, but tinygrad 0.14's CUDA graph still
  # passes every buffer, and building the graph fails ("invalid argument"): a second row keeps the signature whole
  if block_tables.shape[0] == 1: block_tables = block_tables.pad(((0, 1), None))
  # one output buffer holds each chunk's partial result: [acc (D), m, l]
  part = Tensor.empty(N, H, C, D + 2, dtype=f32, device=q.device).custom_kernel(q, k_pool, v_pool, block_tables, token_seq,
                                                                                cached_lens if dense else ctx_lens, fxn=fxn)[0]
  m, l, acc = part[..., D], part[..., D+1], part[..., :D]
  if dense:
    dm, dl, dacc = in_step_attention(q, k, v, token_seq)
    m, l, acc = m.cat(dm.unsqueeze(-1), dim=-1), l.cat(dl.unsqueeze(-1), dim=-1), acc.cat(dacc.unsqueeze(2), dim=2)
  w = (m - m.max(-1, keepdim=True)).exp()   # each partial's weight; an empty chunk (m = -inf) weighs 0
  return ((acc * w.unsqueeze(-1)).sum(2) / (l * w).sum(-1).unsqueeze(-1)).cast(q.dtype)
