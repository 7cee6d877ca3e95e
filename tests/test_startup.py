"""Start-up: a second process reuses the schedules and lowered kernels that the first one stored in tinygrad's cache.db (it schedules no
kernel anew while capturing its step graphs), and both still generate the recorded transformers greedy text."""
import json, os, subprocess, sys, pytest
# each child compiles as this process does: under xdist in the process itself, not on tinygrad's pool of one (conftest.py)
from tinygrad.helpers import PARALLEL

CASE = json.load(open(os.path.join(os.path.dirname(__file__), "data", "reference.json")))["cases"][0]
CHILD = """
import json, sys, tinygrad.schedule
from tinyvllm import LLM, SamplingParams
from tinyvllm.model_runner import ModelRunner
case, scheduled, capturing, capture, get_kernel_graph = json.loads(sys.argv[1]), [], [], ModelRunner.capture_next, tinygrad.schedule.get_kernel_graph
tinygrad.schedule.get_kernel_graph = lambda *args, **kwargs: scheduled.append(1) or get_kernel_graph(*args, **kwargs)
def counted(self): before = len(scheduled); capture(self); capturing.append(len(scheduled) - before)
ModelRunner.capture_next = counted
llm = LLM(sys.argv[2] if len(sys.argv) > 2 else None, device="CPU", max_num_seqs=4, max_num_batched_tokens=16, max_model_len=128)
greedy, outs, captures = SamplingParams(temperature=0, max_tokens=case["num_new_tokens"]), [], [len(capturing)]
# one prompt alone, then a batch of two: only the batch captures the graphs LLM() left on the CPU (those of 2 and 4 tokens)
for n in (1, 2):
  outs.append(llm.generate([case["prompt_token_ids"]] * n, greedy, use_tqdm=False)); captures.append(len(capturing))
print(json.dumps({"scheduled_while_capturing": sum(capturing), "captures": captures, "graphs": len(llm.engine.runner.graphs)}))
print(json.dumps({"outputs": [[o.outputs[0].token_ids, o.outputs[0].text] for out in outs for o in out]}))
"""

def start_up(cache_db:str, *model:str) -> dict:
  run = subprocess.run([sys.executable, "-c", CHILD, json.dumps(CASE), *model], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "CACHEDB": cache_db, "PARALLEL": str(PARALLEL.value)})
  assert run.returncode == 0, run.stderr[-3000:]
  return {k: v for line in run.stdout.splitlines() if line.startswith("{") for k, v in json.loads(line).items()}

def test_second_start_up_reuses_the_stored_schedules_and_matches_the_reference(tmp_path):
  """The second start serves a copy of the bundled model from another folder: the stored caches are keyed by the model's config, not by
  where it lies (bench.py makes a new folder for every run)."""
  import shutil
  from tinyvllm.config import BUNDLED_MODEL
  first, second = start_up(str(tmp_path / "cache.db")), start_up(str(tmp_path / "cache.db"), shutil.copytree(BUNDLED_MODEL, tmp_path / "copy"))
  assert first["scheduled_while_capturing"] > 0 and second["scheduled_while_capturing"] == 0
  # 5 buckets (1-16) x 2 sampler variants: 5 model graphs, and 2 sampler graphs for each of the 3 row counts (1, 2, 4: max_num_seqs). At
  # ready, 6 units (those of 1 and 16 tokens, and of the prompt-sized 8 and 16); the 4 of 2 and 4 tokens only before the batch of two
  assert first["captures"] == second["captures"] == [6, 6, 10] and first["graphs"] == second["graphs"] == 5 + 2 * 3
  for run in (first, second):
    assert run["outputs"] == [[CASE["output_token_ids"], CASE["output_text_in_context"]]] * 3

OWN_CACHES = """
import json, sqlite3, sys, tinygrad.helpers
from tinyvllm import LLM
budget, *other = sys.argv[1:]
# a batch of two after each LLM(): on the CPU it captures the graphs LLM() left, and the caches are stored once all are in
if other: LLM(other[0], device="CPU", max_num_seqs=4, max_num_batched_tokens=16).generate(["a", "b"], use_tqdm=False)   # another engine first
llm = LLM(device="CPU", max_num_seqs=4, max_num_batched_tokens=int(budget))
llm.generate(["Once upon a time", "Lily"], use_tqdm=False)
db, key = sqlite3.connect(tinygrad.helpers.CACHEDB), llm.engine.runner.cache_key
table = next(t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE name LIKE 'tinyvllm_caches%'"))
print(json.dumps({k: db.execute(f"SELECT length(val) FROM '{table}' WHERE key = ?", (k,)).fetchone()[0] for k in (key, key + " ready")}))
"""

def own_caches(db:str, budget:int, *other:str) -> dict:
  """OWN_CACHES in a fresh process on the cache.db at db: the sizes of what the bundled model's engine of that token budget stored."""
  run = subprocess.run([sys.executable, "-c", OWN_CACHES, str(budget), *other], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "CACHEDB": db, "PARALLEL": str(PARALLEL.value)})
  assert run.returncode == 0, run.stderr[-3000:]
  return json.loads(run.stdout.splitlines()[-1])

@pytest.fixture(scope="module")
def alone(tmp_path_factory) -> tuple[dict, str]:
  """The engine (token budget 16) alone in a fresh cache.db: what it stored, the reference of both tests below, and that cache.db. One
  cold start for both (~50 s on a 2-core xdist worker)."""
  db = str(tmp_path_factory.mktemp("alone") / "cache.db")
  return own_caches(db, 16), db

def test_an_engine_stores_only_its_own_caches(tmp_path, alone):
  """tinygrad's schedule and program caches belong to the process: an engine made after another one (a test suite, a notebook's second
  LLM) must store under its keys only what its own graphs need, not the other engine's too, which every later start would read (the
  bundled model's entries had grown 7x after one other engine, 70x after the test suite)."""
  import shutil
  from tinyvllm.config import BUNDLED_MODEL
  shutil.copytree(BUNDLED_MODEL, other := tmp_path / "other")
  config = json.load(open(other / "config.json"))
  json.dump(config | {"rms_norm_eps": 1e-6}, open(other / "config.json", "w"))   # another model to tinygrad: its own kernels and keys
  after_another, reference = own_caches(str(tmp_path / "cache.db"), 16, str(other)), alone[0]
  assert all(0 < after_another[key] < 1.1 * reference[key] for key in reference), (reference, after_another)

def test_engines_of_other_flags_store_apart(tmp_path, alone):
  """Each engine configuration keeps its stored caches under its own key: under one key per model, every start also read what the other
  configurations had stored (the test suite's engines grew the bundled model's first-graphs entry to 4.6 MB, 1.3 s of a CPU start)."""
  import sqlite3
  reference, shared = alone[0], str(tmp_path / "shared.db")
  sqlite3.connect(alone[1]).backup(sqlite3.connect(shared))   # the engine's entries, stored alone
  own_caches(shared, 8)   # another token budget, into the same cache.db
  # the first engine again: it reads its entries back and, having nothing to add, stores nothing. Under one key per model the other
  # budget's engine had read them, added its own kernels and stored them back, and this one would read back twice as much
  after_another = own_caches(shared, 16)
  assert after_another.keys() == reference.keys(), (reference, after_another)
  assert all(0 < after_another[key] < 1.1 * reference[key] for key in reference), (reference, after_another)

def test_the_shipped_cache_only_adds_rows_that_cache_db_lacks(tmp_path):
  """The shipped sm_90 kernels and BEAM results are SQL that ModelRunner runs on tinygrad's cache.db: it creates the tables it misses and
  inserts only missing rows, so a row the user's cache holds keeps its value, and applying it again changes nothing."""
  import lzma, re, sqlite3
  from tinyvllm.model_runner import SHIPPED_CACHE
  script = lzma.open(SHIPPED_CACHE, "rt").read()
  assert not re.search(r"^(CREATE TABLE (?!IF NOT EXISTS)|INSERT (?!OR IGNORE)|REPLACE|UPDATE|DELETE|DROP)", script, re.M)
  db = sqlite3.connect(tmp_path / "cache.db")
  db.executescript(script)
  tables = {name: db.execute(f"SELECT count(*) FROM '{name}'").fetchone()[0] for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
  assert any(name.startswith("compile_cuda_sm_90") for name in tables) and any(name.startswith("beam_search") for name in tables)
  table = next(name for name in tables if name.startswith("compile_cuda_sm_90"))
  key = db.execute(f"SELECT key FROM '{table}' LIMIT 1").fetchone()[0]
  db.execute(f"UPDATE '{table}' SET val = x'00' WHERE key = ?", (key,)); db.commit()   # the user's own binary for that kernel
  db.executescript(script)
  assert db.execute(f"SELECT val FROM '{table}' WHERE key = ?", (key,)).fetchone()[0] == b"\x00"
  assert {name: db.execute(f"SELECT count(*) FROM '{name}'").fetchone()[0] for name in tables} == tables

# decode GEMVs of the benchmark engines the shipped cache is built from (scripts/build_cache.py): (rows M, rows of x, N, K, experts stacked
# or 0, rows of W per lane): Llama-3.2-1B's at batch 1 and 2, then Qwen3-30B-A3B's experts (gate_up reads x's row of each token, down its own)
# at batch 1 and in its largest step under the tiles (32 tokens: on Hopper the tiles take steps from 4 rows per expert)
SHIPPED_GEMVS = [(1, 1, 3072, 2048, 0, 1), (1, 1, 2048, 2048, 0, 1), (1, 1, 16384, 2048, 0, 1), (1, 1, 2048, 8192, 0, 1),
                 (2, 2, 128256, 2048, 0, 1), (8, 1, 1536, 2048, 128, 2), (8, 8, 2048, 768, 128, 2), (256, 32, 1536, 2048, 128, 2)]

@pytest.mark.parametrize("M, X, N, K, E, rows", SHIPPED_GEMVS)
def test_the_shipped_cache_holds_todays_gemv(M, X, N, K, E, rows):
  """The shipped cache is only worth shipping while it holds the kernels the engine compiles: the GEMV rendered for CUDA sm_90 here (no
  GPU needed) must be a key of its compiled binaries, byte for byte. A change to the kernel fails this until the cache is rebuilt
  (scripts/build_cache.py on an H100), so the cache cannot fall behind the kernels again."""
  import functools, lzma
  from tinygrad import UOp, dtypes
  from tinygrad.uop.ops import Ops
  from tinygrad.codegen import full_rewrite_to_sink, do_linearize, do_render
  from tinyvllm import gemm
  from tinyvllm.model_runner import SHIPPED_CACHE
  from test_attention import RENDERERS, make_renderer
  cls, target, _ = RENDERERS["CUDA"]
  ren, bf16 = make_renderer(cls, target), dtypes.bfloat16
  shapes = [((M, N), bf16), ((X, K), bf16), ((N * max(E, 1), K), bf16)] + ([((M,), dtypes.int32)] if E else [])
  ast = functools.partial(gemm._gemv_kernel, lanes=32, rows=rows, vec=4)(*[UOp.placeholder(s, d, i) for i, (s, d) in enumerate(shapes)])
  prg = do_linearize(ren, UOp(Ops.PROGRAM, src=(sink := full_rewrite_to_sink(ast, ren, optimize=False),)), sink)
  src = do_render(ren, prg, prg.src[1]).src[2].arg
  assert "gemv" in src and src.replace("'", "''") in lzma.open(SHIPPED_CACHE, "rt").read(), "rebuild it: python scripts/build_cache.py"

def test_the_server_is_ready_before_its_graphs_are_captured_and_gives_the_same_tokens():
  """The server says ready (/health 200) once a decode and a 64-token prompt chunk can run; the other graphs are captured while no
  request runs, one at a time, so a stream opened at ready never waits for one. A long prompt sent at ready runs whole (on the CPU the
  prompt-sized buckets are in from the start, each captured at its first use) and gives the tokens it gives once every graph is in, and
  every graph gets captured."""
  import asyncio, time, uuid, numpy as np
  from starlette.testclient import TestClient
  from tinyvllm import Config, SamplingParams
  from tinyvllm.llm_engine import AsyncLLM
  from tinyvllm.serve import build_app
  llm = AsyncLLM(Config(device="CPU", max_num_seqs=32, enable_prefix_caching=False))   # the second time, the prompt is computed again
  runner, steps, prepare = llm.engine.runner, [], llm.engine.runner.prepare
  runs_in = []   # each step's (token count, the bucket it runs in)
  def counted(batch, *args):
    steps.append(total := sum(num_new for _, num_new in batch))
    runs_in.append((total, args[0] if args else min(b for b in runner.buckets if b >= total)))
    return prepare(batch, *args)
  runner.prepare = counted
  try:
    assert runner.pending and runner.buckets == [1, 64, 128, 256, 512]   # on the CPU the prompt-sized buckets (over 32 rows) from the start
    with TestClient(build_app(llm)) as client: assert client.get("/health").status_code == 200
    prompt = [1] + np.random.default_rng(0).integers(3, 512, 449).tolist()
    async def stream(params:SamplingParams) -> tuple[list[int], float]:   # the tokens, and the longest wait between two of them
      ids, times = [], []
      async for out in llm.generate(prompt, params, uuid.uuid4().hex): ids += out.outputs[0].token_ids; times.append(time.monotonic())
      return ids, max(np.diff(times))
    requests = [SamplingParams(temperature=0, max_tokens=32, ignore_eos=True), SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=32)]
    async def one_after_another(): return [await stream(params) for params in requests]
    pending, graphs, at_ready = list(runner.pending), set(runner.graphs), asyncio.run(one_after_another())
    assert max(steps) == 450 and at_ready[0][1] < 1.5   # the whole prompt in one step; the plain request waited for no capture
    assert runner.pending == pending   # the second request followed the first at once: no idle capture came between them
    assert set(runner.graphs) == graphs   # nor one on the spot: the top-p request ran on a sampler captured before ready
    # three streams at once, with no idle moment since ready: the server captures the bucket they need (4) between steps, rather than
    # running them in the 64-token bucket until it idles (1.6x slower decode steps on a GPU, issue #70)
    async def side_by_side(): return await asyncio.gather(*[stream(requests[0]) for _ in range(3)])
    assert 4 not in runner.buckets and [ids for ids, _ in asyncio.run(side_by_side())] == [at_ready[0][0]] * 3
    assert (3, 4) in runs_in and 4 in runner.buckets
  finally:   # every graph in before the test ends: an engine still capturing would share tinygrad with the next test's
    deadline = time.monotonic() + 300
    while runner.pending: assert time.monotonic() < deadline, runner.pending; time.sleep(0.1)
  assert runner.buckets == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512] and len(runner.graphs) == 10 + 2 * 6   # sampler rows: 1-32
  steps.clear()
  assert [asyncio.run(stream(params))[0] for params in requests] == [ids for ids, _ in at_ready] and max(steps) == 450

def test_the_one_entry_substitute_gives_tinygrads_result(monkeypatch):
  """model_runner answers tinygrad's UOp.substitute({node: value}) on that node itself with the value, skipping the rewrite that walks the
  value's UOps (lowering swaps each compiled program in for its kernel so, half of a CPU graph capture). Through a whole engine start-up
  and generation, every such call must give what tinygrad's own rewrite gives: the same UOp."""
  from tinygrad import UOp
  from tinyvllm import LLM, SamplingParams, model_runner
  ours, same = UOp.substitute, []
  def checked(u, subs, **kwargs):
    if not kwargs and subs.keys() == {u}: same.append(model_runner.tinygrad_substitute(u, subs) is ours(u, subs))
    return ours(u, subs, **kwargs)
  monkeypatch.setattr(UOp, "substitute", checked)
  llm = LLM(device="CPU", max_num_seqs=2, max_num_batched_tokens=8, max_model_len=64)
  out = llm.generate([CASE["prompt_token_ids"]], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0].outputs[0]
  assert len(same) > 100 and all(same) and out.token_ids == CASE["output_token_ids"][:8]
