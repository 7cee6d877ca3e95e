"""Every linear layer's matmul, on every device: model.py calls `matmul` (y = x @ w.T, the dense layers, the LM head and the MoE experts),
which picks the kernel by shape and device, and model_runner and attention.py take `empty` (output buffers, split for tensor parallelism)
from here. It holds, in file order:
- the Hopper tensor-core GEMM (SRC, _kernel, plan): bf16 with fp32 accumulation, CUDA source that tinygrad launches as an Ops.PROGRAM
  through Tensor.custom_kernel, so it stays lazy and replays inside TinyJit's CUDA graph (tinygrad's own matmuls reach ~5% of cuBLAS on
  Hopper: they stage no tiles through shared memory and cannot use wgmma, which needs the sm_90a target tinygrad never sets);
- the GEMV for decode-sized steps (_gemv_kernel): portable UOp source, every device, also with an expert per row for MoE decode;
- `empty`, `all_reduce` (tensor parallelism: the sum of row-parallel partial products) and `hopper` (where the GEMM runs);
- `matmul`, the entry point: our GEMV, our GEMM, or tinygrad's own matmul where neither fits.
On one request's path it sits under model.py, below everything but tinygrad; it knows nothing of requests, paging or sampling."""
import functools, os
from tinygrad import Tensor, Device, UOp, dtypes
from tinygrad.uop.ops import Ops, KernelInfo, ProgramInfo, AxisType, AddrSpace
from tinygrad.renderer import Estimates

# A CTA computes a BM x BN tile of C = A @ W^T (A: M x K, W: N x K, both K-contiguous, so HF weights need no transpose) with BM/64
# warpgroups, each a wgmma m64nBNk16 chain reading both operands from shared memory. K streams in 64-wide stages through a ring of ST
# cp.async buffers, filled ST-2 stages ahead while one wgmma group stays in flight over the barrier and the next loads (retiring every
# group at once to load ST-1 ahead measured 2-13% slower). In SASS the main loop is HGMMA; the accumulators stay in registers, no spills.
# - load: a stage is BM rows of A then BN rows of W, 128 bytes each; 16-byte chunk c of row r goes to chunk c^(r%8), the 128-byte swizzle
#   that wgmma's descriptors (desc: K-major, 8-row groups 1024 bytes apart) read, so a warp's accesses spread over all banks; the swizzle
#   works on address bits, hence 1024-byte aligned stages. Rows past M copy 0 bytes: cp.async zero-fills them.
# - main loop: after the wait and the barrier, stage kt has landed and every warpgroup has retired the wgmma group that read stage kt-2,
#   so that slot is refilled. cp.async writes through the generic proxy and wgmma reads through the async one, hence the proxy fence.
# - store: a warp holds 16 rows of its warpgroup's 64; a lane rows lane/4 (+8), columns 2*(lane%4)+{0,1} of each 8.
# - MoE: a CTA reads the rows of W of its tile's expert X[blockIdx.x]; a tile of expert -1 (padding past the last expert's rows, see
#   Transformer.experts) exits at once.
SRC = r"""typedef unsigned short u16; typedef unsigned u32; constexpr int NT = BM/64*128, SB = (BM+BN)*128;
__device__ __forceinline__ void load(u32 s, const u16 *A, const u16 *W, int m0, int n0, int k0) {
  for (int i = threadIdx.x; i < (BM+BN)*8; i += NT) {
    int r = i/8, c = i%8, a = r < BM, g = a ? m0 + r : n0 + r - BM, ok = !a || g < M;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(s + r*128 + ((c ^ r%8) << 4)),
                 "l"((a ? A : W) + (size_t)(ok ? g : 0)*K + k0 + c*8), "r"(ok ? 16 : 0));
  }
  asm volatile("cp.async.commit_group;");
}
__device__ __forceinline__ unsigned long long desc(u32 s) { return (s & 0x3FFFF) >> 4 | 1ull << 16 | 64ull << 32 | 1ull << 62; }
extern "C" __global__ void __launch_bounds__(NT, 228*1024/(ST*SB+2048)) NAME(void *C, const u16 *A, const u16 *W EXPERTS) {
  if (EXPERT < 0) return;
  W += (size_t)EXPERT*N*K;
  extern __shared__ char smem[]; const u32 s0 = ((u32)__cvta_generic_to_shared(smem) + 1023) & ~1023u;
  const int m0 = blockIdx.x*BM, n0 = blockIdx.y*BN, k0 = blockIdx.z*(K/S), wg = threadIdx.x/128;
  float d[BN/2] = {};
  for (int s = 0; s < ST-2; s++) load(s0 + s*SB, A, W, m0, n0, k0 + s*64);
  for (int kt = 0; kt < K/S/64; kt++) {
    asm volatile("cp.async.wait_group %0; fence.proxy.async.shared::cta;" :: "n"(ST-3) : "memory");
    __syncthreads();
    if (kt + ST-2 < K/S/64) load(s0 + (kt+ST-2)%ST*SB, A, W, m0, n0, k0 + (kt+ST-2)*64); else asm volatile("cp.async.commit_group;");
    const u32 s = s0 + kt%ST*SB;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    for (int k = 0; k < 4; k++) MMA(desc(s + wg*8192 + k*32), desc(s + BM*128 + k*32));
    asm volatile("wgmma.commit_group.sync.aligned; wgmma.wait_group.sync.aligned 1;" ::: "memory");
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  const int m = m0 + wg*64 + threadIdx.x%128/32*16 + threadIdx.x%32/4, n = n0 + threadIdx.x%4*2;
  #pragma unroll
  for (int j = 0; j < BN/8; j++) for (int h = 0; h < 2; h++) if (m + h*8 < M) {
    const size_t o = (size_t)(m + h*8)*N + n + j*8;
    if (S > 1) *(float2*)((float*)C + blockIdx.z*(size_t)M*N + o) = make_float2(d[4*j+2*h], d[4*j+2*h+1]);
    else asm volatile("{.reg .b32 v; cvt.rn.bf16x2.f32 v, %1, %2; st.global.b32 [%0], v;}" :: "l"((u16*)C + o), "f"(d[4*j+2*h+1]), "f"(d[4*j+2*h]));
  }
}"""

# dynamic shared memory each kernel launches with, by name
SMEM: dict[str, int] = {}

@functools.cache
def _launch_with_smem(program_t:type):
  # tinygrad's CUDAProgram takes an smem size but is always built without one, so every launch gets 0 bytes of dynamic shared memory
  init = program_t.__init__; program_t.__init__ = lambda self, dev, obj, smem=0: init(self, dev, obj, SMEM.get(obj.name, smem))

@functools.cache
def _kernel(M:int, N:int, K:int, dev:str, BM:int, BN:int, ST:int, S:int, moe:bool=False):
  # imported here, so other backends never load CUDA's libraries
  from tinygrad.runtime.support.compiler_cuda import NVRTCCompiler
  _launch_with_smem(Device[dev].runtime_t); SMEM[name := f"gemm{'_moe' * moe}_{BM}x{BN}x{ST}"] = ST*(BM+BN)*128 + 1024
  # the accumulator tile, BN/2 floats per thread: its registers in the instruction, bound to d[] as read-write outputs
  regs, binds = ",".join(f"%{i}" for i in range(BN//2)), ", ".join(f'"+f"(d[{i}])' for i in range(BN//2))
  mma = f'asm volatile("wgmma.mma_async.sync.aligned.m64n{BN}k16.f32.bf16.bf16 {{{regs}}}, %{BN//2}, %{BN//2+1}, 1, 1, 1, 0, 0;" : {binds}'
  # EXPERTS, EXPERT (MoE): the expert of each BM-row tile
  defs = {"NAME": name, "M": M, "N": N, "K": K, "BM": BM, "BN": BN, "ST": ST, "S": S, "MMA(a, b)": mma + ' : "l"(a), "l"(b))',
          "EXPERTS": ", const int *X" if moe else "", "EXPERT": "X[blockIdx.x]" if moe else 0}
  src = "".join(f"#define {k} {v}\n" for k, v in defs.items()) + SRC; lib = NVRTCCompiler("sm_90a", ptx=False).compile_cached(src)
  # outs/ins are what the JIT's memory planner and the CUDA graph's dependency edges see: C written, A and W (and the experts) read
  info = ProgramInfo(name, global_size=(-(-M//BM), N//BN, S), local_size=(BM//64*128, 1, 1), globals=tuple(range(3 + moe)), outs=(0,),
                     ins=tuple(range(1, 3 + moe)), target=Device[dev].renderer.target)
  # a PROGRAM whose last src is a BINARY counts as compiled: tinygrad launches it as is
  return lambda *bufs: UOp(Ops.PROGRAM, src=(UOp.sink(*bufs, arg=KernelInfo(name=name, estimates=Estimates(ops=2*M*N*K, mem=2*(M*K+N*K+M*N)))),
                                             UOp(Ops.LINEAR, src=bufs), UOp(Ops.SOURCE, arg=src), UOp(Ops.BINARY, arg=lib)), arg=info)

def plan(M:int, N:int, K:int) -> tuple[int, int, int, int]:
  """(BM, BN, stages, S), picked from scripts/bench_gemm.py --sweep on an H100: the large tile where the shape allows, then K split S ways
  while the CTAs still fit one wave on the 132 SMs, as cuBLAS does for skinny outputs: one CTA's k-loop runs at well under its SM's
  tensor-core rate, so a grid of few tiles leaves most of the GPU idle."""
  BM, BN, ST, S = (128, 256, 4, 1) if M > 64 and N % 256 == 0 else (64, 128, 8, 1)
  while S < 8 and -(-M//BM) * (N//BN) * S * 2 <= 132 and K % (S * 128) == 0 and K // (S * 2) >= 64 * (ST - 2): S *= 2
  return BM, BN, ST, S

def _gemv_kernel(Y:UOp, X:UOp, W:UOp, *experts:UOp, lanes:int, rows:int, vec:int) -> UOp:
  # a decode step's few rows m: reading W is the whole cost. A warp's lanes split K, each loading `vec` adjacent 32-bit words (16 bytes
  # where K allows) of `rows` rows of W, so each load of x serves `rows` rows and each load of W every m; the lanes meet in shared memory.
  # 16-bit inputs are read as words of two elements: tinygrad widens uint loads, not 16-bit ones, and a bitcast Tensor would be a copy.
  # MoE decode (experts given): row m reads the N rows of its expert experts[m] in W, the E experts stacked (E*N, K), and the row of x of
  # its token, m // (M / rows of x). Its rows share no W then, so they are a grid axis, not unrolled (the CPU loops over them)
  (M, N), K, dtype, f32 = Y.shape, X.shape[1], X.dtype, dtypes.float
  if dtype.itemsize == 2: X, W = (UOp.placeholder((P.shape[0], P.shape[1] // 2), dtypes.uint32, slot) for P, slot in ((X, 1), (W, 2)))
  # the CPU runs one lane, its row blocks and rows m in plain loops (tinygrad's CPU runtime launches each index of a GLOBAL axis from
  # Python), and keeps a row's `vec` words as `vec` sums, added up at the end: one chain of vector adds, which clang vectorizes, where the
  # GPU's one sum of every word was a chain of scalar adds (2-3 GB/s of the CPU's ~11; BENCHMARKS.md)
  gpu, loop = lanes > 1, AxisType.LOOP
  block, lane = (UOp.range(n, i, t if gpu else loop) for n, i, t in ((N // rows, 0, AxisType.GLOBAL), (lanes, 1, AxisType.LOCAL)))
  step, v = UOp.range(W.shape[1] // (lanes*vec), 2, AxisType.REDUCE), UOp.range(vec, 3, AxisType.UNROLL if gpu else AxisType.UPCAST)
  r, m = UOp.range(rows, 4, AxisType.UPCAST), UOp.range(M, 5, (AxisType.GLOBAL if experts else AxisType.UPCAST) if gpu else loop)
  n, k = block * rows + r, (step * lanes + lane) * vec + v
  # the expert id is clamped into the stack, so that no id can read outside W
  wn, xm = (experts[0][m].maximum(0).minimum(W.shape[0] // N - 1).cast(dtypes.weakint) * N + n, m // (M // X.shape[0])) if experts else (n, m)
  half = lambda word, h: (word >> 16*h).cast(dtypes.uint16).bitcast(dtype).cast(f32)
  dot = sum(half(W[wn, k], h) * half(X[xm, k], h) for h in (0, 1)) if W.dtype != dtype else W[wn, k].cast(f32) * X[xm, k].cast(f32)
  acc = dot.reduce(step, v, arg=Ops.ADD) if gpu else dot.reduce(step, arg=Ops.ADD).reduce(v, arg=Ops.ADD)
  # a grid axis m has a block of its own: shared memory for one row
  if gpu:
    shared, j = UOp.placeholder((rows, 1 if experts else M, lanes), f32, 20, addrspace=AddrSpace.LOCAL), UOp.range(lanes, 6, AxisType.REDUCE)
    acc = shared.after(shared[r, m % shared.shape[1], lane].store(acc))[r, m % shared.shape[1], j].reduce(j, arg=Ops.ADD)
  # tag=1: our axes are final, tinygrad's optimizer leaves them (as attention.py's)
  return Y[m, n].store(acc.cast(Y.dtype)).end(m, r).end(lane, block).sink(arg=KernelInfo(name=f"gemv{'_moe' * bool(experts)}_{M}_{N}_{W.shape[1]}",
    opts_to_apply=(), estimates=Estimates(ops=2*M*N*K, mem=N*K*dtype.itemsize*(M if experts else 1))), tag=1)

def empty(shape:tuple[int, ...], dtype, device, axis:int|None=None) -> Tensor:
  """An output buffer on one device, copied to every device of a tuple, or (tensor parallel) split on `axis`: each device holds only its
  shard, as tinygrad's creation helpers build sharded tensors (a buffer of one shard's shape on every device, marked as split)."""
  if axis is None or not isinstance(device, tuple) or len(device) == 1: return Tensor.empty(*shape, dtype=dtype, device=device)
  shard = [n // len(device) if i == axis else n for i, n in enumerate(shape)]
  return Tensor(Tensor.empty(*shard, dtype=dtype, device=device).uop.unshard(axis))

def all_reduce(x:Tensor) -> Tensor:
  """x (tp*M, N) split on axis 0, each device's shard its partial sum (a row-parallel matmul's) -> their sum (M, N) on every device."""
  return x.reshape(len(x.device), -1, x.shape[1]).sum(0)

def hopper(device) -> bool:
  """A GPU the wgmma kernel runs on: sm_90 under CUDA (tinygrad's NV backend does not run Hopper); SM90A_GEMM=0: none."""
  return str(device).startswith("CUDA") and Device[device].renderer.target.arch == "sm_90" and os.getenv("SM90A_GEMM") != "0"

def matmul(x:Tensor, w:Tensor, cfg:tuple[int, int, int, int]|None=None, experts:Tensor|None=None) -> Tensor:
  """x (M, K) @ w (N, K).T: decode-sized M through our GEMV on every device; larger M on a Hopper GPU under CUDA through our wgmma kernel
  (SM90A_GEMM=0 turns it off, to measure the portable path), elsewhere tinygrad's own matmul (on the CPU over a packed copy of W).
  MoE, w (E, N, K) a layer's stacked experts: experts (A,) the expert of each output row (see _gemv_kernel), through the GEMV where K fills its
  words; or (tiles, T) the expert of each tile of T rows of x (larger steps), so that a tile reads its expert once: on Hopper through the
  wgmma kernel (T = 64, its tile), elsewhere through tinygrad's matmul with the gather of w folded into its loads."""
  # tensor parallel: w split by rows (axis 0: each device computes its own output columns) or by columns (axis 1: each device a partial
  # sum, all-reduced below), or copied (None: every device computes all of it). The kernels see one device's shapes: K_dev and N_dev
  tp, split, dev = (len(w.device), w.uop.axis, w.device[0]) if isinstance(w.device, tuple) else (1, None, x.device)
  (M, K), N, lanes = x.shape, w.shape[-2], 32 if Device[dev].renderer.has_local else 1
  K_dev, N_dev = K // tp if split == 1 else K, N // tp if split == 0 else N
  wgmma = hopper(dev) and x.dtype == w.dtype == dtypes.bfloat16 and K_dev % 64 == 0 and K_dev >= 512 and N_dev % 128 == 0
  # the GEMV below 4 rows beside wgmma, whose 64-row tiles read W faster from there on (scripts/bench_gemv.py on an H100)
  # vec: 32-bit words per load; 0: no GEMV
  vec = next((v for v in (4, 2, 1) if x.dtype == w.dtype and K_dev * x.dtype.itemsize % (4 * lanes * v) == 0), 0)
  # MoE tiles: on Hopper, tiles of 64 rows are wgmma's, each reading the rows of its own expert. Elsewhere realized at the tiles' shape: the
  # reshape to rows, fused into the matmul, merged a tile's rows into one axis, and tinygrad then read W per row instead of once per tile
  # (TTFT(1024) of Qwen3-30B-A3B 8x slower on the H100)
  if experts is not None and ((not wgmma or experts.shape[1] != 64) if experts.ndim > 1 else not vec):
    rows_x = x.reshape(M, 1, 1, K).expand(M, experts.numel() // M, 1, K).reshape(*experts.shape, 1, K)
    return (rows_x @ w[experts].transpose(-1, -2)).contiguous().reshape(-1, N)
  # 2 rows of W per lane from 4 rows of x, and for the experts' rows (the down projection's short K read 1.4x faster so at batch 1)
  rows = 2 if (M >= 4 or experts is not None) and N_dev % 2 == 0 else 1
  # MoE: the experts our kernels take, of each row (GEMV) or of each tile (wgmma)
  ids = () if experts is None else (experts if experts.ndim == 1 else experts[:, 0].contiguous(),)
  # our GEMV: for an expert per row (MoE decode; tiles reach here only for wgmma, 64 rows each), or for a few rows where K fills its words
  gemv = experts.ndim == 1 if experts is not None else vec > 0 and M < (4 if wgmma else 16)
  # neither kernel of ours: tinygrad's matmul (which all-reduces a row-parallel product itself). On the CPU over W^T copied into tiles of
  # 8 columns, each tile's K rows one contiguous run, which tinygrad's C code loads as vectors: from 16 rows faster than our GEMV, the copy
  # (each prompt step's) included, where W^T as it lies was slower (scripts/bench_cpu_matmul.py, BENCHMARKS.md)
  packed = lambda: w.reshape(N // 8, 8, K).permute(0, 2, 1).contiguous().permute(1, 0, 2).reshape(K, N)
  if not gemv and not wgmma: return x @ (packed() if lanes == 1 and tp == 1 and N % 8 == 0 else w.T)
  BM, BN, ST, S = (0, 0, 0, 1) if gemv else cfg or ((64, 128, 8, 1) if ids else plan(M, N_dev, K_dev))
  # split K: S partial products in float32, summed by tinygrad (fused into whatever reads the result); row-parallel, tp devices' S each
  rows_out = (S * tp if split == 1 else S) * (ids[0].shape[0] if gemv and ids else M)
  out = empty((rows_out, N), dtypes.float if S > 1 else x.dtype, x.device, {0: 1, 1: 0}.get(split))
  if gemv: out = out.custom_kernel(x, w.reshape(-1, K), *ids, fxn=functools.partial(_gemv_kernel, lanes=lanes, rows=rows, vec=vec))[0]
  else: out = out.custom_kernel(x, w, *ids, fxn=_kernel(M, N_dev, K_dev, dev, BM, BN, ST, S, bool(ids)))[0]
  if S > 1: out = out.reshape(-1, S, M, N).sum(1).cast(x.dtype).reshape(-1, N)
  return all_reduce(out) if split == 1 else out
