"""Paged KV cache (vLLM's PagedAttention): the slot-major KV pool write and attention over block tables, and step_attention, the two
for one layer, which model_runner hands the model bound to a step (the model calls it, and nothing calls back up).

The pool is (num_slots, KVH, D) with slot = block*block_size + offset, the layout of vLLM's `reshape_and_cache`. One attention call serves a
whole mixed step: every query token (decode or prefill chunk) carries the block-table row of its sequence and its position, so causal
masking inside a prefill chunk falls out of the positions (as in vLLM's flattened varlen batches)."""
import math, functools
from tinygrad import Tensor, UOp, dtypes, Device
from tinygrad.uop.ops import KernelInfo, AxisType, Ops, AddrSpace
from tinygrad.renderer import Estimates
from tinyvllm.gemm import empty

# step sizes whose in-step attention is a dense (N, N) matmul (measured on an H200, see BENCHMARKS.md)
DENSE_MIN, DENSE_MAX = 512, 2048

def _kv_write_kernel(KP:UOp, VP:UOp, SL:UOp, QKV:UOp) -> UOp:
  # vLLM's reshape_and_cache: pool[slots[n]] = kv[n] for both pools in one launch; O(N) work, slot -1 (padding row) is skipped. k and v
  # are the last 2*KVH heads of QKV
  n, h, w, KVH = UOp.range(QKV.shape[0], 0), UOp.range(KP.shape[1], 1), UOp.range(KP.shape[2], 2), KP.shape[1]
  # out-of-pool slots are skipped too: the bound also lets tinygrad drop index wrapping
  s = (s := SL[n].cast(dtypes.weakint)).valid((s >= 0) & (s < KP.shape[0]))
  bits = lambda head, i: QKV[n, head, i].bitcast(dtypes.uint16).cast(dtypes.uint32)
  # a 16-bit pool's word: the bits of two adjacent elements (see words)
  word = lambda head: QKV[n, head, w].cast(KP.dtype) if KP.shape[2] == QKV.shape[2] else bits(head, 2*w) | bits(head, 2*w + 1) << 16
  k, v = word(QKV.shape[1] - 2*KVH + h), word(QKV.shape[1] - KVH + h)
  return UOp.group(KP[s, h, w].store(k), VP[s, h, w].store(v)).end(n, h, w).sink(arg=KernelInfo(name="kv_write"))

# 16-bit pools hold 32-bit words of two elements each, as tinygrad widens uint loads to 16 bytes and leaves bf16 ones scalar
words = lambda x: x.bitcast(dtypes.uint32) if x.dtype.itemsize == 2 else x

# The paged attention kernel's axes (UOp.range ids) and buffers, GPU / CPU where they differ; U = D/LANES dims per lane, P positions per
# iteration:
#   id  name  size                       type              walks
#    0  n     N                          GLOBAL            query tokens
#    1  c     C                          GLOBAL / LOOP     chunks of each token's context (flash-decoding)
#    2  e     LANES (D/8 / 1)            LOCAL / LOOP      lanes of a KV head, each owning U of the D dims
#    3  kvh   KVH                        LOCAL / LOOP      KV heads
#    4  t     ceil(L[n] / (C*P))         REDUCE            iterations over the chunk's positions (data-dependent trip count)
#    5  k     U                          UNROLL            a lane's dims in the q.k dot product
#    6  d     U                          UPCAST            a lane's dims of the output (acc)
#    8  g     G = H/KVH                  UPCAST            the KV head's query heads (GQA)
#   10  j     LANES                      REDUCE            the lanes' partial dot products summed (GPU only)
#   11  q     P                          UPCAST            the iteration's positions
#   buffers (placeholder slots): 10 m (G,), 11 l (G,), 12 acc (G, U) in registers (online softmax); 20 the lanes' partial scores
#   (KVH, LANES, G, P) in shared memory (GPU only). tinygrad numbers its own reduce accumulators from 0, hence ours from 10
def _paged_attention_kernel(OUT:UOp, Q:UOp, KP:UOp, VP:UOp, BT:UOp, TS:UOp, L:UOp, block_size:int, has_local:bool) -> UOp:
  # flash-decoding (vLLM's paged_attention_v2): each query token's context is split into C equal chunks, and a thread group per
  # (token n, KV head, chunk c) walks its chunk once with an online softmax for the KV head's G query heads. The partial (m, l, acc) of the
  # chunks are merged afterwards with plain tinygrad ops.
  # OUT[..., :D] = acc, [D] = m, [D+1] = l
  (N, H, C, _), (NS, KVH, W), (S, MAXB), D = OUT.shape, KP.shape, BT.shape, Q.shape[2]; G, f32, P = H // KVH, dtypes.float, 2
  # GPU: a workgroup per (token, chunk), D/8 lanes per KV head, each owning 8 of the D dimensions for all G query heads of the KV head (vLLM's
  # thread groups with GQA): a K/V load serves G heads, and the registers stay few. CPU: one GLOBAL axis, no LOCAL axes, one lane.
  LANES, U = (D // 8, 8) if has_local else (1, D)
  n, c = UOp.range(N, 0, AxisType.GLOBAL), UOp.range(C, 1, AxisType.GLOBAL if has_local else AxisType.LOOP)
  # the lane axis comes first so that it varies fastest across a warp: a KV head's lanes read one contiguous K/V row
  e, kvh = (UOp.range(size, axis, AxisType.LOCAL if has_local else AxisType.LOOP) for size, axis in ((LANES, 2), (KVH, 3)))
  k, g, d = UOp.range(U, 5, AxisType.UNROLL), UOp.range(G, 8, AxisType.UPCAST), UOp.range(U, 6, AxisType.UPCAST)
  # clamping the loaded ints proves every index in bounds, which keeps garbage inputs from reading out of the pool and lets tinygrad
  # drop its index wrapping (% on every load); L[n] = positions to read (the cached prefix in dense steps, positions[n]+1 otherwise), so
  # the loop runs ceil(L[n] / (C*P)) times, a data-dependent trip count
  seq, ctx = TS[n].maximum(0).minimum(S-1).cast(dtypes.weakint), L[n].maximum(0).minimum(MAXB*block_size).cast(dtypes.weakint)
  # each iteration reads P positions (q) at once, so that their K/V loads are in flight together (2 measured best on an H100, BENCHMARKS.md)
  t, q = UOp.range(steps := (ctx + (C*P - 1)) // (C*P), 4, AxisType.REDUCE), UOp.range(P, 11, AxisType.UPCAST)
  # this iteration's P positions, clamped into the context; L = 0 (nothing cached): no iterations
  valid, pos = (first := (c * steps + t) * P) + q < ctx, (first + q).minimum(ctx - 1).maximum(0)
  # the page table: each position's slot in the pool
  slot = BT[seq, pos // block_size].maximum(0).minimum(NS//block_size - 1).cast(dtypes.weakint) * block_size + pos % block_size
  # a 16-bit pool holds words of two elements (see words)
  row = lambda pool, d: (pool[slot, kvh, d] if W == D else (pool[slot, kvh, d//2] >> d%2*16).cast(dtypes.uint16).bitcast(Q.dtype)).cast(f32)
  score = (Q[n, kvh*G + g, e*U + k].cast(f32) * row(KP, e*U + k)).reduce(k, arg=Ops.ADD)
  # the lanes' partial dot products meet in shared memory (tinygrad places the barriers around it)
  if LANES > 1:
    shared, j = UOp.placeholder((KVH, LANES, G, P), f32, 20, addrspace=AddrSpace.LOCAL), UOp.range(LANES, 10, AxisType.REDUCE)
    score = shared.after(shared[kvh, e, g, q].store(score))[kvh, j, g, q].reduce(j, arg=Ops.ADD)
  score = valid.where(score * (1 / math.sqrt(D)), -math.inf)
  # online-softmax state in registers, per head g: running max m, running denominator l, unnormalized output acc[g, U]; (re)initialized per
  # (n, c, kvh, e). Slots start at 10: tinygrad numbers its own reduce accumulators from 0
  state = lambda shape, slot, init, *r: UOp.placeholder(shape, f32, slot, addrspace=AddrSpace.REG).after(n, c, kvh, e)[r].set(init, end=r)
  m, l, acc = state((G,), 10, -math.inf, g), state((G,), 11, 0.0, g), state((G, U), 12, 0.0, g, d); pm, pl = m.after(t)[g], l.after(t)[g]
  m_new = pm.maximum(score.reduce(q, arg=Ops.MAX))
  # rescale of the old state (none while every position so far was past the end: then m_new is still -inf), weights of the positions
  alpha, p = (first < ctx).where((pm - m_new).exp(), 1.0), valid.where((score - m_new).exp(), 0.0)
  upd = UOp.group(m[g].store(m_new), l[g].store(pl * alpha + p.reduce(q, arg=Ops.ADD)),
                  acc[g, d].store(acc.after(t)[g, d] * alpha + (p * row(VP, e*U + d)).reduce(q, arg=Ops.ADD)).end(d)).end(g, t)
  # every lane holds the same m and l
  out = UOp.group(OUT[n, kvh*G + g, c, e*U + d].store(acc.after(upd)[g, d]).end(d), OUT[n, kvh*G + g, c, D].store(m.after(upd)[g]),
                  OUT[n, kvh*G + g, c, D+1].store(l.after(upd)[g])).end(g)
  # tag=1 marks the AST as already optimized: tinygrad's range optimizer leaves our hand-placed axes and register state alone, and our
  # (empty) estimates are kept, as the data-dependent trip count can't be counted statically (the stats code would crash on it)
  return out.end(e, kvh, c, n).sink(arg=KernelInfo(name="paged_attention", opts_to_apply=(), estimates=Estimates()), tag=1)

def in_step_attention(q:Tensor, k:Tensor, v:Tensor, token_seq:Tensor, gpu=True) -> tuple[Tensor, Tensor, Tensor]:
  """Softmax partials (m, l, acc) of each token over the step's own tokens of its sequence up to itself (causal), through batched matmuls that
  tinygrad runs on tensor cores. A prefill chunk is dense causal attention; the block-diagonal mask separates the step's sequences."""
  (N, H, D), KVH = q.shape, k.shape[1]; idx = Tensor.arange(N).to(q.device)
  s = q.reshape(N, KVH, H // KVH, D).permute(1, 2, 0, 3).matmul(k.permute(1, 2, 0).unsqueeze(1), dtype=dtypes.float) / math.sqrt(D)
  # (KVH, G, N, N): causal, and only within each token's own sequence
  s = ((token_seq.unsqueeze(1) == token_seq.unsqueeze(0)) & (idx.unsqueeze(0) <= idx.unsqueeze(1))).where(s, -math.inf)
  # the CPU realizes P once, for P x V and its sum: fused into them, its exp was recomputed for every output (29% of a 512-token step)
  m = s.max(-1, keepdim=True); p = (s - m).exp() if gpu else (s - m).exp().contiguous()
  # probabilities in 16 bits, as flash-attention does. acc gets its own buffer: fused into the merge in paged_attention, P x V became a kernel
  # with two reductions, which tinygrad runs without tensor cores (7x slower on an H200)
  acc = (p.cast(q.dtype) if gpu else p).matmul(v.permute(1, 0, 2).unsqueeze(1), dtype=dtypes.float).contiguous()
  to_nh = lambda t: t.permute(2, 0, 1, 3).reshape(N, H, t.shape[3]); return to_nh(m)[..., 0], to_nh(p.sum(-1, keepdim=True))[..., 0], to_nh(acc)

def paged_attention(qkv:Tensor, k_pool:Tensor, v_pool:Tensor, block_tables:Tensor, token_seq:Tensor, positions:Tensor, cached_lens:Tensor,
                    block_size:int) -> Tensor:
  """qkv (N, H+2*KVH, D), the heads of q, k, v -> (N, H, D): token n (at positions[n] of sequence token_seq[n], whose block_tables (S, MAXB)
  row maps positions to pool slots) attends to positions 0..positions[n]. The pools already hold this step's k, v; cached_lens[n] = how many
  of the sequence's positions came from earlier steps (the step's own tokens of a sequence are consecutive rows, as vLLM flattens varlen
  batches)."""
  (N, _, D), KVH, ctx_lens = qkv.shape, k_pool.shape[1], positions + 1; H = qkv.shape[1] - 2*KVH
  assert H % KVH == 0, f"GQA needs H={H} to be a multiple of KVH={KVH}"
  # tensor parallel: qkv, the pools and the output are split by head, each device running the kernels on its own heads
  tp, dev = (len(qkv.device), qkv.device[0]) if isinstance(qkv.device, tuple) else (1, qkv.device)
  # vLLM's split of prefill and decode attention: in prefill-sized steps the kernel reads only the cached prefix and the step's own tokens
  # meet through tensor-core matmuls. Smaller steps are mostly decodes (one in-step token each: the kernel alone is cheaper), and the
  # (N, N) scores of larger ones grow quadratically, so those read everything through the kernel. C: enough chunks to fill the GPU at
  # small batches, few enough that the partial results stay small for prefill-sized steps
  gpu = Device[dev].renderer.has_local
  dense, C = DENSE_MIN <= N <= DENSE_MAX, max(1, min(64, 1024 // N, -(-block_tables.shape[1] * block_size // 8))) if gpu else 1
  fxn = functools.partial(_paged_attention_kernel, block_size=block_size, has_local=gpu)
  # with a one-row table token_seq is provably 0 and tinygrad drops it from the kernel's parameters, but tinygrad 0.14's CUDA graph still
  # passes every buffer, and building the graph fails ("invalid argument"): a second row keeps the signature whole
  if block_tables.shape[0] == 1: block_tables = block_tables.pad(((0, 1), None))
  # one output buffer holds each chunk's partial result: [acc (D), m, l]
  # (the kernel reads q's heads of qkv in place)
  part = empty((N, H, C, D + 2), dtypes.float, qkv.device, 1).custom_kernel(qkv, k_pool, v_pool, block_tables, token_seq,
                                                                            cached_lens if dense else ctx_lens, fxn=fxn)[0]
  m, l, acc = part[..., D], part[..., D+1], part[..., :D]
  # the in-step attention's partials join as one more chunk
  if dense:
    # each device's own q, k and v heads
    q, k, v = qkv.reshape(N, tp, -1, D).split([H // tp, KVH // tp, KVH // tp], dim=2)
    in_step = in_step_attention(q.reshape(N, H, D), k.reshape(N, KVH, D), v.reshape(N, KVH, D), token_seq, gpu)
    m, l, acc = [t.cat(d.unsqueeze(dim), dim=dim) for t, d, dim in zip((m, l, acc), in_step, (-1, -1, 2))]
  # each partial's weight; an empty chunk (m = -inf) weighs 0
  w = (m - m.max(-1, keepdim=True)).exp()
  # (N, H, chunks, D)
  acc = acc * w.unsqueeze(-1)
  # many chunks (small batches) are summed in two rounds, 8 groups then their sums: in one, tinygrad gave the sum too few threads (8 thread
  # blocks at batch 1 with D = 128, ~20 us of a Qwen3-30B-A3B decode layer on an H100; BENCHMARKS.md)
  if acc.shape[2] % 32 == 0: acc = acc.reshape(N, H, 8, -1, D).sum(3).contiguous()
  return (acc.sum(2) / (l * w).sum(-1).unsqueeze(-1)).cast(qkv.dtype)

def step_attention(kv:list[list[Tensor]], step:dict[str, Tensor], block_size:int, layer:int, qkv:Tensor) -> Tensor:
  """One layer's attention in a step, as the model calls it, attention(layer, qkv) -> (N, H, D), once model_runner has given it the
  step (functools.partial): kv, every layer's [K pool, V pool]; step, the step's inputs by name (slots, block_tables (rows, MAXB),
  token_seq, positions, cached_lens: see paged_attention). The layer's k and v, the last 2*KVH heads of qkv (N, H+2*KVH, D), are written
  into its pools (words(...) of (num_slots, KVH, D)) at slots (N,) int32 in place (-1 = padding row, by the kv_write kernel), then attended
  over."""
  k_pool, v_pool = kv[layer][0].custom_kernel(kv[layer][1], step["slots"], qkv, fxn=_kv_write_kernel)[:2]
  return paged_attention(qkv, k_pool, v_pool, step["block_tables"], step["token_seq"], step["positions"], step["cached_lens"], block_size)
