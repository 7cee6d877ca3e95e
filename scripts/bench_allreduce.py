"""Checks and times scripts/allreduce_oneshot.py's one-shot all-reduce against tinygrad's own (`.reshape(tp, M, N).sum(0)`) on CUDA GPUs.

DEV=CUDA python scripts/bench_allreduce.py   (TP=2 by default; needs TP GPUs with peer access)
1. correctness against numpy, fresh random partials, several shapes and dtypes, every device's copy, eager and over >= 20 TinyJit replays
   (ours must equal numpy's float32 sum rounded once, bit for bit, at TP=2; tinygrad's path within the dtype's rounding);
2. a TinyJit graph chaining 64 all-reduces (x -> all_reduce -> a local op giving each device its next partial -> ...), 100 replays, checked;
3. timing inside TinyJit: one all-reduce and the 64-chain, ours and tinygrad's: wall time a replay, and GPU time a replay with the replays
   queued behind a long kernel, so that they run back to back and the host's launch cost is left out.
Never touches tinygrad's CPU device (on the GPU machine CC is gcc, which rejects its flags): outputs are read from each device's buffer.
Failures are counted, not raised, so that one run yields every result; the exit status is the number of failed checks."""
import ctypes, functools, math, os, sys, time
os.environ.setdefault("GRAPH_ONE_KERNEL", "1")   # a TinyJit of one kernel would otherwise replay as a plain launch, not a CUDA graph
import numpy as np
from tinygrad import Tensor, TinyJit, Device, dtypes
from allreduce_oneshot import all_reduce, HALF

TP = int(os.getenv("TP", "2"))
DEVS = tuple(f"CUDA:{i}" for i in range(TP))
NP = {dtypes.bfloat16: np.uint16, dtypes.half: np.float16, dtypes.float: np.float32}
failures: list[str] = []

def tinygrad_all_reduce(x:Tensor) -> Tensor: return x.reshape(TP, -1, x.shape[1]).sum(0)

def rnd(a:np.ndarray, dtype) -> np.ndarray:
  """a (float32) rounded to dtype, to nearest even, back in float32."""
  if dtype == dtypes.half: return a.astype(np.float16).astype(np.float32)
  if dtype != dtypes.bfloat16: return a.astype(np.float32)
  u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
  return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)

def partials(M:int, N:int, dtype, rng) -> tuple[Tensor, np.ndarray]:
  """(TP*M, N) sharded on axis 0 and its values in float32 as (TP, M, N); made on CUDA:0 (never the CPU device), cast there."""
  host = rnd(rng.standard_normal((TP * M, N), dtype=np.float32), dtype)
  return Tensor(host, device=DEVS[0]).cast(dtype).shard(DEVS, axis=0).realize(), host.reshape(TP, M, N)

def read(t:Tensor, i:int) -> np.ndarray:
  """device i's copy of a replicated tensor, as float32, straight from its buffer."""
  raw = np.frombuffer(t.realize().uop.buffer.bufs[i].as_memoryview(), NP[t.dtype])
  return ((raw.astype(np.uint32) << 16).view(np.float32) if t.dtype == dtypes.bfloat16 else raw.astype(np.float32)).reshape(t.shape)

def check(name:str, t:Tensor, ref:np.ndarray, exact:bool, tol:float|None=None, quiet=False) -> None:
  """every device's copy of t against ref (float32 sum, already rounded to t's dtype); exact: bit for bit, else within tol (rounding)."""
  tol = tol or {dtypes.bfloat16: 2**-7, dtypes.half: 2**-10, dtypes.float: 1e-6}[t.dtype]
  for i in range(TP):
    got = read(t, i)
    err, same = float(np.max(np.abs(got - ref) / (np.abs(ref) + 1e-3))), np.array_equal(got, ref)
    ok = same if exact else err <= tol
    if not ok: failures.append(f"{name} dev{i}")
    if not ok or not quiet:
      print(f"  {name:44s} dev{i}: {'ok' if ok else 'FAIL'} (bit-equal to numpy: {same}; max rel err {err:.2e}, {'exact' if exact else tol} asked)")

def sum_ref(parts:np.ndarray, dtype) -> np.ndarray:
  acc = parts[0].astype(np.float32)
  for p in parts[1:]: acc = acc + p   # float32, device order, as the kernel sums
  return rnd(acc, dtype)

def correctness(rng) -> None:
  print(f"== 1. correctness: {TP} devices, exchange buffer half {HALF >> 10} KB (bigger shards take tinygrad's path)")
  shapes = [(1, 4096, dtypes.bfloat16), (4, 4096, dtypes.bfloat16), (64, 4096, dtypes.bfloat16), (1, 8192, dtypes.bfloat16),
            (4, 4096, dtypes.half), (3, 1000, dtypes.float), (512, 4096, dtypes.bfloat16), (1, 4100, dtypes.bfloat16),
            (1024, 4096, dtypes.bfloat16)]
  for M, N, dtype in shapes:
    ours = M * N * dtype.itemsize <= HALF and M * N * dtype.itemsize % 16 == 0
    tag = f"{M}x{N} {dtype.name} ({'one-shot' if ours else 'fallback'})"
    x, parts = partials(M, N, dtype, rng)
    check(f"{tag} eager", all_reduce(x), sum_ref(parts, dtype), exact=ours and TP == 2)
    jit, n = TinyJit(all_reduce), 20 if M * N <= 1 << 18 else 5
    for r in range(n + 2):   # 2 runs to capture, then replays
      x, parts = partials(M, N, dtype, rng)
      check(f"{tag} TinyJit run {r}", jit(x), sum_ref(parts, dtype), exact=ours and TP == 2, quiet=r < n + 1)
    print(f"  {tag}: {n + 2} TinyJit runs checked")

def chain(ar, w:Tensor, steps=64):
  """x -> all_reduce -> each device's next partial (a local elementwise op, as a row-parallel layer's matmul would give) -> ..."""
  def f(x:Tensor) -> Tensor:
    for _ in range(steps):
      y = ar(x)
      x = y.repeat(TP, 1) * w
    return y
  return f

def chain_ref(parts:np.ndarray, w:np.ndarray, dtype, steps=64) -> np.ndarray:
  y = sum_ref(parts, dtype)
  for _ in range(steps - 1): y = sum_ref(rnd(y[None] * w, dtype), dtype)   # the products of two bf16 are exact in float32
  return y

def chain_weights(M:int, N:int, dtype, rng) -> tuple[Tensor, np.ndarray]:
  a = rng.uniform(0.2, 0.8, (TP - 1, M, N)).astype(np.float32) / (TP - 1)   # the devices' weights sum to ~1: values stay bounded
  w = rnd(np.concatenate([a, 1 - a.sum(0, keepdims=True)]), dtype)
  return Tensor(w.reshape(TP * M, N), device=DEVS[0]).cast(dtype).shard(DEVS, axis=0).realize(), w

def chained(rng) -> None:
  print("== 2. 64 all-reduces chained in one TinyJit, 100 replays")
  for name, ar in (("ours", all_reduce), ("tinygrad", tinygrad_all_reduce)):
    w, wn = chain_weights(1, 4096, dtypes.bfloat16, rng)
    jit = TinyJit(chain(ar, w))
    for r in range(102):
      x, parts = partials(1, 4096, dtypes.bfloat16, rng)
      check(f"chain {name} run {r}", jit(x), chain_ref(parts, wn, dtypes.bfloat16), exact=False, tol=5e-2, quiet=0 < r < 101)

def sync() -> None:
  for d in DEVS: Device[d].synchronize()

@functools.cache
def busy_kernel() -> tuple[Tensor, float]:
  """a matmul on DEVS[0] and its seconds: enough of them queued first keep the GPU busy while the host queues the timed replays"""
  a = Tensor.empty(8192, 8192, device=DEVS[0])
  for _ in range(2): (a @ a).realize()
  sync()
  t = time.perf_counter()
  (a @ a).realize()
  sync()
  return a, time.perf_counter() - t

def gpu_seconds(fn, x:Tensor, n:int, busy_s:float) -> float:
  """GPU time of n replays: queued behind eager matmuls on DEVS[0] (the context the CUDA graphs then launch into), they run back to back
  between two CUDA events on that stream."""
  import tinygrad.runtime.autogen.cuda as cuda
  from tinygrad.runtime.ops_cuda import check as ok
  dev, (a, mm_s) = Device[DEVS[0]], busy_kernel()
  t, k = time.perf_counter(), math.ceil(busy_s / mm_s)
  for _ in range(k): (a @ a).realize()
  ok(cuda.cuCtxSetCurrent(dev.context))   # events belong to the context current when they are made
  evs = [cuda.CUevent() for _ in range(2)]
  for e in evs: ok(cuda.cuEventCreate(ctypes.byref(e), 0))
  ok(cuda.cuEventRecord(evs[0], None))
  for _ in range(n): fn(x)
  queued = time.perf_counter() - t
  cuda.cuCtxGetCurrent(ctypes.byref(cur := cuda.CUcontext()))
  if ctypes.cast(cur, ctypes.c_void_p).value != ctypes.cast(dev.context, ctypes.c_void_p).value:
    print("  warning: a replay switched the current context: the events may not bracket the graphs")
  ok(cuda.cuCtxSetCurrent(dev.context))
  ok(cuda.cuEventRecord(evs[1], None))
  ok(cuda.cuEventSynchronize(evs[1]))
  ok(cuda.cuEventElapsedTime(ctypes.byref(ms := ctypes.c_float()), evs[0], evs[1]))
  for e in evs: ok(cuda.cuEventDestroy_v2(e))
  sync()
  if queued > k * mm_s: print(f"  warning: queueing took {queued * 1e3:.1f} ms, the busy kernels {k * mm_s * 1e3:.1f}: GPU time includes idle gaps")
  return ms.value / 1e3

def timed(fn, x:Tensor, n=200) -> tuple[float, float]:
  """(wall, GPU) seconds a TinyJit replay."""
  for _ in range(5): fn(x)
  sync()
  t = time.perf_counter()
  for _ in range(n): fn(x)
  sync()
  wall = (time.perf_counter() - t) / n
  try: return wall, gpu_seconds(fn, x, n, busy_s=3 * wall * n + 0.02) / n
  except RuntimeError as e:   # a CUDA error of the event calls: keep the wall time
    print(f"  GPU timing failed: {e}")
    return wall, float("nan")

def timing(rng) -> list[tuple]:
  print("== 3. timing inside TinyJit")
  rows = []
  for M, N in ((1, 4096), (64, 4096)):
    x, _ = partials(M, N, dtypes.bfloat16, rng)
    for name, ar in (("ours", all_reduce), ("tinygrad", tinygrad_all_reduce)):
      wall, gpu = timed(TinyJit(ar), x)
      rows.append((f"1 all-reduce {M}x{N} bf16 ({M * N * 2 >> 10} KB)", name, wall, gpu, gpu))
      print(f"  {rows[-1]}")
  x, _ = partials(1, 4096, dtypes.bfloat16, rng)
  w, _ = chain_weights(1, 4096, dtypes.bfloat16, rng)
  for name, ar in (("ours", all_reduce), ("tinygrad", tinygrad_all_reduce)):
    wall, gpu = timed(TinyJit(chain(ar, w)), x, n=100)
    rows.append(("64-chain 1x4096 bf16", name, wall, gpu, gpu / 64))
    print(f"  {rows[-1]}")
  def local_only(x:Tensor) -> Tensor:   # the chain's local op alone, 64 kernels (contiguous: else tinygrad fuses the 64 into one)
    for _ in range(64): x = (x * w).contiguous()
    return x
  wall, gpu = timed(TinyJit(local_only), x, n=100)
  rows.append(("64 local ops only (no all-reduce)", "-", wall, gpu, gpu / 64))
  print(f"  {rows[-1]}")
  for row in rows[-3:-1]: rows.append(("64-chain minus the local ops", row[1], row[2] - wall, row[3] - gpu, (row[3] - gpu) / 64))
  return rows

if __name__ == "__main__":
  rng = np.random.default_rng(0)
  print(f"devices: {[Device[d].renderer.target.arch for d in DEVS]}, peer access: {getattr(Device[DEVS[-1]], 'peer_access', None)}")
  for step in (correctness, chained):
    t = time.perf_counter()
    step(rng)
    print(f"  ({time.perf_counter() - t:.1f} s)")
  rows = timing(rng)
  print(f"\nchecks failed: {len(failures)} {failures[:10]}")
  print(f"\n| {'what':36s} | {'all-reduce':10s} | wall/replay | GPU/replay | GPU/all-reduce |")
  print(f"|{'-' * 38}|{'-' * 12}|-------------|------------|----------------|")
  for what, name, wall, gpu, per in rows: print(f"| {what:36s} | {name:10s} | {wall * 1e6:8.1f} us | {gpu * 1e6:7.1f} us | {per * 1e6:11.2f} us |")
  sys.exit(len(failures))
