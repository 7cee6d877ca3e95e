"""Per-kernel breakdown of one decode (or --prefill) step: python scripts/profile_decode.py --config llama-3.2-1b --batch 1 256 [--device CUDA]
Runs with JIT=2 (graphs off) so tinygrad times each kernel (DEBUG=2); kernels are grouped by name, with time, GB/s, GFLOP/s and share of the step."""
import argparse, collections, contextlib, io, os, re, sys
os.environ["JIT"] = "2"   # before tinygrad is imported: per-kernel timings need the graph off
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from scripts.bench import model_folder   # noqa: E402  (same model / dummy-config resolution as the benchmark)
from tinygrad.helpers import Context  # noqa: E402
from tinyvllm import LLM, SamplingParams  # noqa: E402

# tinygrad prints TFLOPS and TB/s from 100 TFLOPS and 10 TB/s on (the tensor-core GEMMs), GFLOPS and GB/s below
LINE = re.compile(r"\*\*\* +\S+ +\d+ +(\S+) +arg +\d+ mem +[\d.]+ GB tm +([\d.]+)(us|ms|s)/.*?\( *([\d.]+) ([GT])FLOPS +([\d.]+)\|[\d. ]*([GT])B/s")

def profile(llm, batch:int, ctx:int, prefill:bool, beam:int=0, salt:int=0) -> list[tuple]:
  """Kernels of one decode step of `batch` sequences at `ctx` tokens of context, or (prefill) of one step prefilling `batch` x `ctx` tokens.
  salt shifts the prompts' tokens, so that a second call's prompts miss the prefix cache."""
  eng = llm.engine
  for i in range(batch): eng.add_request([1 + (i + j + salt) % 500 for j in range(ctx)], SamplingParams(max_tokens=64, ignore_eos=True, temperature=0.6))
  while not prefill and any(s.num_computed_tokens < s.num_prompt_tokens for s in eng.scheduler.running + list(eng.scheduler.waiting)): eng.step()
  if not prefill: eng.step()
  out = io.StringIO()
  with contextlib.redirect_stdout(out), Context(DEBUG=2, BEAM=beam): eng.step()
  for rid in list(eng.requests): eng.abort(rid)
  kernels = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])   # count, seconds, GFLOP, GB
  for m in LINE.finditer(re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())):
    t = float(m[2]) * {"us": 1e-6, "ms": 1e-3, "s": 1}[m[3]]
    unit = lambda prefix: 1e3 if prefix == "T" else 1
    k = kernels[m[1]]; k[0] += 1; k[1] += t; k[2] += float(m[4]) * unit(m[5]) * t; k[3] += float(m[6]) * unit(m[7]) * t
  return sorted(((name, *v) for name, v in kernels.items()), key=lambda r: -r[2])

if __name__ == "__main__":
  p = argparse.ArgumentParser()
  p.add_argument("--config"); p.add_argument("--model"); p.add_argument("--device")
  p.add_argument("--batch", type=int, nargs="+", default=[1]); p.add_argument("--ctx", type=int, default=128)
  p.add_argument("--kv-cache-memory", type=float, default=None); p.add_argument("--top", type=int, default=12)
  p.add_argument("--beam", type=int, default=0, help="BEAM width for the decode graphs, as bench.py's --beam (searches every bucket <= max batch)")
  p.add_argument("--prefill", action="store_true", help="profile the prefill step of the prompts instead (needs batch x ctx <= 8192)")
  p.add_argument("--enforce-eager", action="store_true", help="no graph captures at start (faster; the step's kernels are the same)")
  p.add_argument("--step-beam", type=int, default=0, help="the profiled step's kernels BEAM-searched at this width (a step run first to search)")
  a = p.parse_args()
  path, load_format = model_folder(a)
  llm = LLM(path, device=a.device, load_format=load_format, max_num_seqs=max(a.batch),
            max_num_batched_tokens=max(2048, max(a.batch) * a.ctx if a.prefill else 0), max_model_len=max(1024, a.ctx + 64),
            kv_cache_memory=a.kv_cache_memory, beam=a.beam, enforce_eager=a.enforce_eager)
  for b in a.batch:
    if a.step_beam: profile(llm, b, a.ctx, a.prefill, a.step_beam, salt=1)
    rows = profile(llm, b, a.ctx, a.prefill, a.step_beam)
    total = sum(r[2] for r in rows)
    print(f"\n## {'prefill' if a.prefill else 'decode'} step, batch {b}, context {a.ctx}: {total*1e3:.2f} ms in {sum(r[1] for r in rows)} kernels (graphs off)")
    print("| kernel | launches | ms | share | GB/s | GFLOP/s |\n|---|---|---|---|---|---|")
    for name, n, t, gf, gb in rows[:a.top]: print(f"| `{name}` | {n} | {t*1e3:.3f} | {t/total:.1%} | {gb/t:.0f} | {gf/t:.0f} |")
    rest = rows[a.top:]
    if rest: print(f"| {len(rest)} others | {sum(r[1] for r in rest)} | {sum(r[2] for r in rest)*1e3:.3f} | {sum(r[2] for r in rest)/total:.1%} | | |")
