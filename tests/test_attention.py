import functools, math
import numpy as np, pytest
from tinygrad import Tensor, TinyJit, UOp, dtypes, Context, Device
from tinygrad.uop.ops import Ops
from tinygrad.helpers import Target
from tinygrad.renderer import Renderer
from tinygrad.renderer.cstyle import CUDARenderer, MetalRenderer, HIPRenderer
from tinygrad.codegen import full_rewrite_to_sink, do_linearize, do_render
from tinyvllm import attention
from tinyvllm.attention import words, paged_attention, step_attention, _kv_write_kernel, _paged_attention_kernel

def kv_write(k_pool, v_pool, slots, qkv):   # the pool write alone, launched as attention.step_attention launches it
  return tuple(k_pool.custom_kernel(v_pool, slots, qkv, fxn=_kv_write_kernel)[:2])

BS, NB, S, MAXB, N, KVH = 4, 16, 4, 3, 16, 2   # block size, pool blocks, sequences, blocks/seq (T=12), query rows per step, kv heads
TOL = {dtypes.float32: 1e-5, dtypes.float16: 2e-3}
NP = {dtypes.float32: np.float32, dtypes.float16: np.float16}

def make_step(rng:np.random.Generator):
  """A mixed step: random block tables (a permutation of the pool's blocks), per-sequence lengths including 1 and exact block
  boundaries, each sequence either one decode row or a prefill chunk (consecutive rows with increasing positions), padding rows last.
  Returns block tables, token_seq, ctx_lens (positions + 1), cached_lens (positions from earlier steps) and the number of real rows."""
  bt = rng.permutation(NB)[:S*MAXB].reshape(S, MAXB).astype(np.int32)
  lens = rng.permutation([1, BS, MAXB*BS, int(rng.integers(2, MAXB*BS))])
  ts, cl, cached = [], [], []
  for s, L in enumerate(lens):
    # prefill chunk of c tokens ending at position L-1 (always for the full-table sequence), else one decode token
    c = min(L, int(rng.integers(2, 5))) if L == MAXB*BS or rng.random() < 0.5 else 1
    ts += [s] * c; cl += list(range(L - c + 1, L + 1)); cached += [L - c] * c
  n_real = len(ts)
  pad = N - n_real   # padding rows sit at position 0 of sequence 0
  return bt, np.array(ts + [0] * pad, np.int32), np.array(cl + [1] * pad, np.int32), np.array(cached + [0] * pad, np.int32), n_real

def ref_attention(q, kp, vp, bt, ts, cl):
  """Naive contiguous attention in float64: gather the sequence's first ctx_len positions, then plain softmax."""
  q, kp, vp = (x.astype(np.float64) for x in (q, kp, vp))
  G, out = q.shape[1] // kp.shape[1], np.zeros(q.shape)
  for n in range(len(q)):
    sl = (bt[ts[n]][:, None] * BS + np.arange(BS)).reshape(-1)[:cl[n]]
    for h in range(q.shape[1]):
      s = kp[sl, h // G] @ q[n, h] / math.sqrt(q.shape[2]); p = np.exp(s - s.max())
      out[n, h] = (p / p.sum()) @ vp[sl, h // G]
  return out

MODES = {"kernel": 0, "kernel+dense": 4096}   # DENSE_MAX (DENSE_MIN is set to 0): the kernel alone, or with in-step dense attention

@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("G,D,dt", [(1, 8, dtypes.float32), (2, 64, dtypes.float16), (4, 128, dtypes.float32), (4, 8, dtypes.float16),
                                    (2, 128, dtypes.float16)])
def test_paged_attention(mode, G, D, dt, monkeypatch):
  dense_max, rng = MODES[mode], np.random.default_rng(D + G)
  monkeypatch.setattr(attention, "DENSE_MIN", 0); monkeypatch.setattr(attention, "DENSE_MAX", dense_max)
  kp, vp = (rng.standard_normal((NB*BS, KVH, D)).astype(NP[dt]) for _ in range(2))
  kpool, vpool = words(Tensor(kp)).contiguous().realize(), words(Tensor(vp)).contiguous().realize()   # 16-bit pools hold words
  step = TinyJit(lambda qkv, bt, ts, pos, cached: paged_attention(qkv, kpool, vpool, bt, ts, pos, cached, BS).realize())
  for _ in range(4):   # eager, capture, 2 replays; new tables / lengths / row mix every call
    bt, ts, cl, cached, n_real = make_step(rng)
    slots = bt[ts, (cl - 1) // BS] * BS + (cl - 1) % BS   # the step's own K/V are already in the pool
    q = rng.standard_normal((N, KVH*G, D)).astype(NP[dt])
    out = step(Tensor(np.concatenate([q, kp[slots], vp[slots]], axis=1)), Tensor(bt), Tensor(ts), Tensor(cl - 1), Tensor(cached))
    assert out.dtype == dt and out.shape == q.shape
    np.testing.assert_allclose(out.numpy()[:n_real], ref_attention(q, kp, vp, bt, ts, cl)[:n_real], atol=TOL[dt], rtol=0)
  assert step.cnt == 4

@pytest.mark.parametrize("max_blocks", [64, 128])
def test_paged_attention_of_many_chunks(max_blocks):
  # long block tables give 32 and 64 chunks a row at this batch, whose weighted sum runs in two rounds (8 groups, then their sums)
  rng, D, G, rows = np.random.default_rng(max_blocks), 128, 4, np.arange(S)
  kp, vp = (rng.standard_normal((S*max_blocks*BS, KVH, D)).astype(np.float32) for _ in range(2))
  bt = rng.permutation(S*max_blocks).reshape(S, max_blocks).astype(np.int32)
  cl = np.array([1, 7, max_blocks*BS // 2 + 3, max_blocks*BS], np.int32)   # one decode row per sequence, its context length
  slots = bt[rows, (cl - 1) // BS] * BS + (cl - 1) % BS
  q = rng.standard_normal((S, KVH*G, D)).astype(np.float32)
  qkv = Tensor(np.concatenate([q, kp[slots], vp[slots]], axis=1))
  out = paged_attention(qkv, Tensor(kp), Tensor(vp), Tensor(bt), Tensor(rows.astype(np.int32)), Tensor(cl - 1), Tensor(cl - 1), BS).numpy()
  np.testing.assert_allclose(out, ref_attention(q, kp, vp, bt, rows, cl), atol=1e-5, rtol=0)

@pytest.mark.parametrize("mode,dt", [("kernel", dtypes.float32), ("kernel", dtypes.float16), ("kernel+dense", dtypes.float16)])
def test_kv_write_then_attention(mode, dt, monkeypatch):
  # the runner's pattern: pools are long-lived buffers, each step writes new K/V at its slots, then attends through the returned pools
  dense_max, D, rng = MODES[mode], 8, np.random.default_rng(0)
  monkeypatch.setattr(attention, "DENSE_MIN", 0); monkeypatch.setattr(attention, "DENSE_MAX", dense_max)
  kp, vp = (rng.standard_normal((NB*BS, KVH, D)).astype(NP[dt]) for _ in range(2))
  kpool, vpool = words(Tensor(kp)).contiguous().realize(), words(Tensor(vp)).contiguous().realize()
  @TinyJit
  def step(slots, qkv, bt, ts, pos, cached):
    kp2, vp2 = kv_write(kpool, vpool, slots, qkv)
    return paged_attention(qkv, kp2, vp2, bt, ts, pos, cached, BS).realize()
  for _ in range(4):
    bt, ts, cl, cached, n_real = make_step(rng)
    # each real row writes its own position (token ts[n] at ctx_len-1); padding rows (-1) carry junk that must not land anywhere
    real = np.arange(N) < n_real
    slots = np.where(real, bt[ts, (cl - 1) // BS] * BS + (cl - 1) % BS, -1).astype(np.int32)
    k, v = (rng.standard_normal((N, KVH, D)).astype(NP[dt]) for _ in range(2))
    q = rng.standard_normal((N, KVH*2, D)).astype(NP[dt])
    out = step(Tensor(slots), Tensor(np.concatenate([q, k, v], axis=1)), Tensor(bt), Tensor(ts), Tensor(cl - 1), Tensor(cached)).numpy()
    kp[slots[real]], vp[slots[real]] = k[real], v[real]   # untouched slots keep their old values
    np.testing.assert_array_equal(kpool.bitcast(dt).numpy(), kp); np.testing.assert_array_equal(vpool.bitcast(dt).numpy(), vp)
    np.testing.assert_allclose(out[:n_real], ref_attention(q, kp, vp, bt, ts, cl)[:n_real], atol=TOL[dt], rtol=0)

def test_bf16_pools_hold_packed_words():
  # GPUs run bf16 but CI's clang 14 builds no bf16: tinygrad's PYTHON device emulates it, so kv_write's packing of two bf16 into each
  # 32-bit word and the kernel's unpacking are checked against numpy on the same bf16-rounded values
  rng, D, dt, T = np.random.default_rng(3), 16, dtypes.bfloat16, functools.partial(Tensor, device="PYTHON")
  bf16 = lambda x: T(x).cast(dt)
  rounded = lambda x: bf16(x).float().numpy()
  kp, vp = (rng.standard_normal((NB*BS, KVH, D)).astype(np.float32) for _ in range(2))
  kpool, vpool = words(bf16(kp)).contiguous().realize(), words(bf16(vp)).contiguous().realize()
  assert kpool.dtype == dtypes.uint32 and kpool.shape == (NB*BS, KVH, D // 2)
  bt, ts, cl, cached, n_real = make_step(rng)
  real = np.arange(N) < n_real
  slots = np.where(real, bt[ts, (cl - 1) // BS] * BS + (cl - 1) % BS, -1).astype(np.int32)
  k, v, q = (rng.standard_normal((N, h, D)).astype(np.float32) for h in (KVH, KVH, KVH*2))
  qkv = bf16(np.concatenate([q, k, v], axis=1))
  # as the model calls it: the step's inputs by name, layer 0 of a one-layer pool
  step = {"slots": T(slots), "block_tables": T(bt), "token_seq": T(ts), "positions": T(cl - 1), "cached_lens": T(cached)}
  out = step_attention([[kpool, vpool]], step, BS, 0, qkv).float().numpy()
  kp, vp = rounded(kp), rounded(vp)
  kp[slots[real]], vp[slots[real]] = rounded(k)[real], rounded(v)[real]
  np.testing.assert_array_equal(kpool.bitcast(dt).float().numpy(), kp); np.testing.assert_array_equal(vpool.bitcast(dt).float().numpy(), vp)
  np.testing.assert_allclose(out[:n_real], ref_attention(rounded(q), kp, vp, bt, ts, cl)[:n_real], atol=2e-2, rtol=0)

# tinygrad's Python emulator with a GPU's target: the UOps run as that GPU would get them (LOCAL axes, shared memory, its tensor cores in
# tinygrad's own matmuls), which the CPU never runs. DEV selects the emulated target for the whole process, so each test sets it in a Context
EMULATORS = ["PYTHON::METAL", "PYTHON::gfx1100"]

@pytest.mark.parametrize("target", EMULATORS)
@pytest.mark.parametrize("dt,mode", [(dtypes.float32, "kernel+dense"), (dtypes.bfloat16, "kernel")])
def test_gpu_form_on_emulated_gpus(target, dt, mode, monkeypatch):
  # kv_write then paged attention in their GPU form (D/8 lanes a KV head meeting in shared memory, C chunks a token), a mixed step of
  # decodes and prefill chunks, against numpy on the same (bf16-rounded) values. kernel+dense: the in-step tokens through tinygrad's matmuls
  rng, D, G = np.random.default_rng(5), 16, 2
  monkeypatch.setattr(attention, "DENSE_MIN", 0); monkeypatch.setattr(attention, "DENSE_MAX", MODES[mode])
  with Context(DEV=target):
    assert Device[Device.DEFAULT].renderer.has_local and Device.DEFAULT == "PYTHON"
    T = lambda x: Tensor(x).cast(dt)
    rounded = lambda x: T(x).float().numpy()
    kp, vp = (rounded(rng.standard_normal((NB*BS, KVH, D)).astype(np.float32)) for _ in range(2))
    kpool, vpool = words(T(kp)).contiguous().realize(), words(T(vp)).contiguous().realize()
    bt, ts, cl, cached, n_real = make_step(rng)
    real = np.arange(N) < n_real
    slots = np.where(real, bt[ts, (cl - 1) // BS] * BS + (cl - 1) % BS, -1).astype(np.int32)
    q, k, v = (rounded(rng.standard_normal((N, h, D)).astype(np.float32)) for h in (KVH*G, KVH, KVH))
    qkv = T(np.concatenate([q, k, v], axis=1))
    kp2, vp2 = kv_write(kpool, vpool, Tensor(slots), qkv)
    out = paged_attention(qkv, kp2, vp2, Tensor(bt), Tensor(ts), Tensor(cl - 1), Tensor(cached), BS).float().numpy()
    kp[slots[real]], vp[slots[real]] = k[real], v[real]
    np.testing.assert_array_equal(kpool.bitcast(dt).float().numpy(), kp); np.testing.assert_array_equal(vpool.bitcast(dt).float().numpy(), vp)
  np.testing.assert_allclose(out[:n_real], ref_attention(q, kp, vp, bt, ts, cl)[:n_real], atol=1e-5 if dt == dtypes.float32 else 2e-2, rtol=0)

def test_kv_write_padding_only_and_out_of_pool():
  kpool, vpool = Tensor.zeros(8, 1, 4).contiguous().realize(), Tensor.zeros(8, 1, 4).contiguous().realize()
  qkv = Tensor.full((4, 1, 4), 5.0).cat(Tensor.ones(4, 1, 4), Tensor.full((4, 1, 4), 2.0), dim=1)   # one query head, then k, then v
  kp, vp = kv_write(kpool, vpool, Tensor([-1, 8, 100, 3], dtype=dtypes.int32), qkv)
  Tensor.realize(kp, vp)
  assert kpool.numpy().sum() == 4 and vpool.numpy().sum() == 8 and kpool.numpy()[3].sum() == 4

# ***** portability: the same UOp source renders for CUDA, METAL and AMD without a GPU (renderers built without their compilers)

def make_renderer(cls, target:Target) -> Renderer:
  ren = object.__new__(cls); Renderer.__init__(ren, target); ren.tensor_cores = []
  return ren

RENDERERS = {"CUDA": (CUDARenderer, Target("CUDA", arch="sm_90"), "__global__"), "METAL": (MetalRenderer, Target("METAL"), "kernel void"),
             "AMD": (HIPRenderer, Target("AMD", "HIP", "gfx942"), "__attribute__((global))")}

@pytest.mark.parametrize("backend", list(RENDERERS))
@pytest.mark.parametrize("name", ["kv_write", "paged_attention"])
@pytest.mark.parametrize("h", [dtypes.half, dtypes.bfloat16])
def test_render(backend, name, h):
  cls, target, marker = RENDERERS[backend]
  ren, pool = make_renderer(cls, target), ((NB*BS, KVH, 32), dtypes.uint32)   # a 16-bit pool holds words
  if name == "kv_write": fxn, args = _kv_write_kernel, [pool, pool, ((N,), dtypes.int32), ((N, 3*KVH, 64), h)]
  else:
    fxn = functools.partial(_paged_attention_kernel, block_size=BS, has_local=True)
    args = [((N, 8, 4, 66), dtypes.float), ((N, 8 + 2*KVH, 64), h), pool, pool, ((S, MAXB), dtypes.int32),
            ((N,), dtypes.int32), ((N,), dtypes.int32)]
  ast = fxn(*[UOp.placeholder(shape, dtype, i) for i, (shape, dtype) in enumerate(args)])
  sink = full_rewrite_to_sink(ast, ren, optimize=ast.tag is None)   # what tinygrad's to_program does
  prg = UOp(Ops.PROGRAM, src=(sink,))
  prg = do_linearize(ren, prg, sink)
  src = do_render(ren, prg, prg.src[1]).src[2].arg
  assert name in src and marker in src
  if name == "paged_attention": assert "%" not in src   # clamped indices: no wrapping modulo on the loads
