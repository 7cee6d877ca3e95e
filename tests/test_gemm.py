"""The small-M GEMV of decode steps (gemm._gemv_kernel), against numpy, for every M from 1 to 16, and its GPU form rendered for CUDA,
METAL and AMD; the CPU's prompt-sized matmuls (gemm.matmul over a packed W) against numpy."""
import functools
import numpy as np, pytest
from tinygrad import Tensor, TinyJit, UOp, dtypes, Context, Device
from tinygrad.uop.ops import Ops
from tinygrad.codegen import full_rewrite_to_sink, do_linearize, do_render
from tinyvllm import gemm
from test_attention import RENDERERS, EMULATORS, make_renderer

NP = {dtypes.float32: np.float32, dtypes.float16: np.float16}

def reference(x:np.ndarray, w:np.ndarray) -> np.ndarray: return x.astype(np.float64) @ w.astype(np.float64).T

def gemv(x:Tensor, w:Tensor, rows:int, vec:int, *experts:Tensor) -> Tensor:
  """The GEMV kernel launched as gemm.matmul launches it, at a config of the test's choosing (the CPU runs one lane); with experts,
  w (E, N, K) and one output row per expert id."""
  out = Tensor.empty(experts[0].shape[0] if experts else x.shape[0], w.shape[-2], dtype=x.dtype)
  return out.custom_kernel(x, w.reshape(-1, w.shape[-1]), *experts, fxn=functools.partial(gemm._gemv_kernel, lanes=1, rows=rows, vec=vec))[0]

@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float16])
@pytest.mark.parametrize("M", range(1, 17))
def test_gemv_matches_numpy(M, dt):
  rng = np.random.default_rng(M)
  x, w = rng.standard_normal((M, 192)).astype(NP[dt]), rng.standard_normal((40, 192)).astype(NP[dt])
  want = reference(x, w)
  for rows, vec in ((1, 1), (2, 4), (4, 2)):   # rows of W per lane, words per load (the CPU runs one lane)
    got = gemv(Tensor(x), Tensor(w), rows, vec).numpy()
    assert got.dtype == NP[dt] and np.abs(got - want).max() / np.abs(want).max() < (1e-6 if dt == dtypes.float32 else 2e-3), (rows, vec)

def test_matmul_routes_small_m_to_the_gemv_inside_a_jit():
  """gemm.matmul sends decode-sized steps to the GEMV (one kernel, no copy of W) and keeps it correct on new inputs in a TinyJit."""
  w = Tensor(np.random.default_rng(0).standard_normal((64, 128)).astype(np.float16)).realize()
  step = TinyJit(lambda x: gemm.matmul(x * 2, w).realize())
  for i in range(3):
    x = np.random.default_rng(i).standard_normal((3, 128)).astype(np.float16)
    got, want = step(Tensor(x)).numpy(), reference(2 * x, w.numpy())
    assert np.abs(got - want).max() / np.abs(want).max() < 2e-3
  names = [str(getattr(u.src[0].arg, "name", "")) for u in step.captured.linear.toposort() if u.op is Ops.CALL]
  assert any(n.startswith("gemv_3_64_") for n in names), names

@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float16])
def test_matmul_of_prompt_sized_steps_matches_numpy(dt):
  """From 16 rows the CPU runs tinygrad's matmul over W^T copied into tiles of 8 columns (N % 8 == 0), else over W^T as it is."""
  rng = np.random.default_rng(16)
  for M, N in ((16, 40), (64, 40), (16, 36)):
    x, w = rng.standard_normal((M, 96)).astype(NP[dt]), rng.standard_normal((N, 96)).astype(NP[dt])
    got, want = gemm.matmul(Tensor(x), Tensor(w)).numpy(), reference(x, w)
    assert got.dtype == NP[dt] and np.abs(got - want).max() / np.abs(want).max() < (1e-6 if dt == dtypes.float32 else 2e-3), (M, N)

@pytest.mark.parametrize("backend", list(RENDERERS))
@pytest.mark.parametrize("M, rows", [(1, 1), (8, 2)])
def test_gemv_renders_with_16_byte_loads(backend, M, rows):
  """The GPU form (a warp of 32 lanes per row block, 4 words per load) renders for each GPU backend without a GPU, and its loads of
  16-bit weights are 16 bytes wide (a 4-wide uint vector), the point of reading them as words."""
  cls, target, marker = RENDERERS[backend]
  ren = make_renderer(cls, target)
  args = [((M, 256), dtypes.bfloat16), ((M, 1024), dtypes.bfloat16), ((256, 1024), dtypes.bfloat16)]
  ast = functools.partial(gemm._gemv_kernel, lanes=32, rows=rows, vec=4)(*[UOp.placeholder(s, d, i) for i, (s, d) in enumerate(args)])
  prg = do_linearize(ren, UOp(Ops.PROGRAM, src=(sink := full_rewrite_to_sink(ast, ren, optimize=False),)), sink)
  src = do_render(ren, prg, prg.src[1]).src[2].arg
  assert marker in src and "gemv" in src and any(f"{t}4 val" in src for t in ("uint", "unsigned_int")), src

@pytest.mark.parametrize("K", [7, 130])
def test_matmul_with_k_that_does_not_fill_whole_words(K):
  """16-bit rows whose bytes do not divide into the GEMV's words (odd K) must not lose their last element: such shapes go elsewhere."""
  rng = np.random.default_rng(K)
  x, w = rng.standard_normal((2, K)).astype(np.float16), rng.standard_normal((8, K)).astype(np.float16)
  got, want = gemm.matmul(Tensor(x), Tensor(w)).numpy(), reference(x, w)
  assert np.abs(got - want).max() / np.abs(want).max() < 2e-3

def expert_reference(x:np.ndarray, w:np.ndarray, ids:np.ndarray) -> np.ndarray:
  """Row a: x's row of its token (a // rows per token) times the rows of expert ids[a]."""
  per_token = len(ids) // len(x)
  return np.stack([w[e].astype(np.float64) @ x[a // per_token].astype(np.float64) for a, e in enumerate(ids)])

@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float16])
@pytest.mark.parametrize("tokens, k", [(1, 8), (3, 2), (5, 3)])
def test_expert_gemv_matches_numpy(tokens, k, dt):
  """The MoE decode GEMV: each row reads only its expert's rows of the stacked (E, N, K) weights, and its token's row of x."""
  rng, E = np.random.default_rng(tokens), 8
  x, w = rng.standard_normal((tokens, 192)).astype(NP[dt]), rng.standard_normal((E, 40, 192)).astype(NP[dt])
  ids = np.concatenate([rng.choice(E, k, replace=False) for _ in range(tokens)]).astype(np.int32)
  want = expert_reference(x, w, ids)
  for rows, vec in ((1, 1), (2, 4), (4, 2)):
    got = gemv(Tensor(x), Tensor(w), rows, vec, Tensor(ids)).numpy()
    assert got.shape == (tokens * k, 40) and np.abs(got - want).max() / np.abs(want).max() < (1e-6 if dt == dtypes.float32 else 2e-3), (rows, vec)
  # an id outside the stack reads the nearest expert, never memory outside W
  got = gemv(Tensor(x[:1]), Tensor(w), 1, 1, Tensor(np.array([-5, E + 3], np.int32))).numpy()
  assert np.abs(got - (want := expert_reference(x[:1], w, np.array([0, E - 1])))).max() / np.abs(want).max() < 2e-3

@pytest.mark.parametrize("K", [7, 192])
def test_matmul_experts_by_row_and_by_tile(K):
  """gemm.matmul's MoE forms against numpy: an expert per row (the GEMV, or tinygrad's matmul where K does not fill whole words), and an
  expert per tile of rows (larger steps: tinygrad's matmul over the tile's expert)."""
  rng = np.random.default_rng(K)
  x, w = rng.standard_normal((4, K)).astype(np.float16), rng.standard_normal((8, 24, K)).astype(np.float16)
  ids = rng.integers(0, 8, 12).astype(np.int32)
  got = gemm.matmul(Tensor(x), Tensor(w), experts=Tensor(ids)).numpy()
  assert np.abs(got - (want := expert_reference(x, w, ids))).max() / np.abs(want).max() < 2e-3
  tiles = rng.integers(0, 8, (2, 1)).astype(np.int32).repeat(2, 1)   # 2 tiles of 2 rows, each owned by one expert
  got = gemm.matmul(Tensor(x), Tensor(w), experts=Tensor(tiles)).numpy()
  assert np.abs(got - (want := expert_reference(x, w, tiles.flatten()))).max() / np.abs(want).max() < 2e-3

@pytest.mark.parametrize("backend", list(RENDERERS))
def test_expert_gemv_renders_as_a_grid_with_16_byte_loads(backend):
  """The GPU form of the MoE GEMV: a block per (row, block of W's rows), so that one W row block is read by every row at once, with
  16-byte loads of the 16-bit weights, for each GPU backend without a GPU."""
  cls, target, marker = RENDERERS[backend]
  ren = make_renderer(cls, target)
  args = [((8, 256), dtypes.bfloat16), ((1, 1024), dtypes.bfloat16), ((16 * 256, 1024), dtypes.bfloat16), ((8,), dtypes.int32)]
  ast = functools.partial(gemm._gemv_kernel, lanes=32, rows=2, vec=4)(*[UOp.placeholder(s, d, i) for i, (s, d) in enumerate(args)])
  prg = do_linearize(ren, UOp(Ops.PROGRAM, src=(sink := full_rewrite_to_sink(ast, ren, optimize=False),)), sink)
  src = do_render(ren, prg, prg.src[1]).src[2].arg
  assert marker in src and "gemv_moe_8_256_512" in src and any(f"{t}4 val" in src for t in ("uint", "unsigned_int")), src

@pytest.mark.parametrize("target", EMULATORS)
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.bfloat16])
def test_gemv_gpu_form_on_emulated_gpus(target, dt):
  """gemm.matmul's GEMV and MoE GEMV in their GPU form (a warp of 32 lanes a row block, meeting in shared memory; 16-bit weights read as
  words), run by tinygrad's Python emulator with the GPU's target (see test_attention), against numpy on the same bf16-rounded values."""
  rng = np.random.default_rng(7)
  with Context(DEV=target):
    assert Device[Device.DEFAULT].renderer.has_local and Device.DEFAULT == "PYTHON"
    T = lambda x: Tensor(x).cast(dt)
    rounded = lambda x: T(x).float().numpy()
    x, w, we = rounded(rng.standard_normal((3, 256))), rounded(rng.standard_normal((10, 256))), rounded(rng.standard_normal((4, 6, 256)))
    ids = np.array([2, 0, 3, 3, 1, 2], np.int32)   # 2 experts a token
    got, got_moe = gemm.matmul(T(x), T(w)).float().numpy(), gemm.matmul(T(x), T(we), experts=Tensor(ids)).float().numpy()
  tol = 1e-6 if dt == dtypes.float32 else 1e-2
  assert np.abs(got - (want := reference(x, w))).max() / np.abs(want).max() < tol
  assert np.abs(got_moe - (want := expert_reference(x, we, ids))).max() / np.abs(want).max() < tol
