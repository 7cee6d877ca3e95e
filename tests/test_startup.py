"""Start-up: a second process reuses the schedules and lowered kernels that the first one stored in tinygrad's cache.db (it schedules no
kernel anew while capturing its step graphs), and both still generate the recorded transformers greedy text."""
import json, os, sqlite3, subprocess, sys, pytest
# each child compiles as this process does: under xdist in the process itself, not on tinygrad's pool of one (conftest.py)
from tinygrad.helpers import PARALLEL

CASE = json.load(open(os.path.join(os.path.dirname(__file__), "data", "reference.json")))["cases"][0]
CHILD = """
import json, sqlite3, sys, tinygrad.helpers, tinygrad.schedule
from tinyvllm import LLM, SamplingParams
from tinyvllm.model_runner import ModelRunner
case, budgets, model = json.loads(sys.argv[1]), json.loads(sys.argv[2]), (sys.argv[3:] or [None])[0]
scheduled, capturing, capture, get_kernel_graph = [], [], ModelRunner.capture_next, tinygrad.schedule.get_kernel_graph
tinygrad.schedule.get_kernel_graph = lambda *args, **kwargs: scheduled.append(1) or get_kernel_graph(*args, **kwargs)
def counted(self): before = len(scheduled); capture(self); capturing.append(len(scheduled) - before)
ModelRunner.capture_next = counted
greedy = SamplingParams(temperature=0, max_tokens=case["num_new_tokens"])
# an engine of each token budget, one after another in this process (a test suite, a notebook's second LLM): the last one serves model
# (None: the bundled one) and reports, the others serve the bundled model
for i, budget in enumerate(budgets):
  capturing.clear()
  llm = LLM(model if i == len(budgets) - 1 else None, device="CPU", max_num_seqs=4, max_num_batched_tokens=budget, max_model_len=128)
  outs, captures = [], [len(capturing)]
  # one prompt alone, then a batch of two: only the batch captures the graphs LLM() left on the CPU (those of 2 and 4 tokens), and the
  # caches are stored once all are in
  for n in (1, 2):
    outs.append(llm.generate([case["prompt_token_ids"]] * n, greedy, use_tqdm=False)); captures.append(len(capturing))
db, key = sqlite3.connect(tinygrad.helpers.CACHEDB), llm.engine.runner.cache_key
table = next(t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE name LIKE 'tinyvllm_caches%'"))
sizes = {k: db.execute(f"SELECT length(val) FROM '{table}' WHERE key = ?", (k,)).fetchone()[0] for k in (key, key + " ready")}
print(json.dumps({"scheduled_while_capturing": sum(capturing), "captures": captures, "graphs": len(llm.engine.runner.graphs)}))
print(json.dumps({"outputs": [[o.outputs[0].token_ids, o.outputs[0].text] for out in outs for o in out], "table": table, "sizes": sizes}))
"""

def start_up(cache_db:str, *budgets:int, model:str|None=None) -> dict:
  """CHILD in a fresh process on the cache.db at cache_db: what the last engine did, and the sizes of the entries it stored."""
  run = subprocess.run([sys.executable, "-c", CHILD, json.dumps(CASE), json.dumps(budgets), *([str(model)] if model else [])],
                       capture_output=True, text=True, timeout=900, env={**os.environ, "CACHEDB": cache_db, "PARALLEL": str(PARALLEL.value)})
  assert run.returncode == 0, run.stderr[-3000:]
  return {k: v for line in run.stdout.splitlines() if line.startswith("{") for k, v in json.loads(line).items()}

def copy_db(db:str, to:str) -> sqlite3.Connection:
  """A copy of the cache.db at db, made at to (sqlite's backup: a copy of the file could miss what is still in its journal)."""
  copy = sqlite3.connect(to)
  sqlite3.connect(db).backup(copy)
  return copy

@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> tuple[dict, str, str]:
  """The engine (token budget 16) alone in a fresh cache.db, one cold start for the tests below (~60 s on a 2-core xdist worker): what
  it did and stored (the reference), that cache.db, and a copy of it to which an engine of another token budget (8) added its own."""
  alone, beside = str(tmp_path_factory.mktemp("alone") / "cache.db"), str(tmp_path_factory.mktemp("beside") / "cache.db")
  reference = start_up(alone, 16)
  copy_db(alone, beside)
  start_up(beside, 8)
  return reference, alone, beside

def test_second_start_up_reuses_the_stored_schedules_and_matches_the_reference(tmp_path, stored):
  """The second start (on a copy of the first one's cache.db) serves a copy of the bundled model from another folder: the stored caches
  are keyed by the model's config, not by where it lies (bench.py makes a new folder for every run)."""
  import shutil
  from tinyvllm.config import BUNDLED_MODEL
  first = stored[0]
  copy_db(stored[1], str(tmp_path / "cache.db"))
  second = start_up(str(tmp_path / "cache.db"), 16, model=shutil.copytree(BUNDLED_MODEL, tmp_path / "copy"))
  assert first["scheduled_while_capturing"] > 0 and second["scheduled_while_capturing"] == 0
  # 5 buckets (1-16) x 2 sampler variants: 5 model graphs, and 2 sampler graphs for each of the 3 row counts (1, 2, 4: max_num_seqs). At
  # ready, 6 units (those of 1 and 16 tokens, and of the prompt-sized 8 and 16); the 4 of 2 and 4 tokens only before the batch of two
  assert first["captures"] == second["captures"] == [6, 6, 10] and first["graphs"] == second["graphs"] == 5 + 2 * 3
  for run in (first, second):
    assert run["outputs"] == [[CASE["output_token_ids"], CASE["output_text_in_context"]]] * 3

def test_an_engine_stores_only_its_own_caches(tmp_path, stored):
  """tinygrad's schedule and program caches belong to the process: an engine made after another one (a test suite, a notebook's second
  LLM) must store under its keys only what its own graphs need, not the other engine's too, which every later start would read (the
  bundled model's entries had grown 7x after one other engine, 70x after the test suite). Here the other engine is the one of token
  budget 8, which reads its entries back from cache.db. This engine's are taken out of it, so that it lowers its kernels anew and stores
  them (clang's binaries stay in: the sizes don't depend on them)."""
  reference, db = stored[0], copy_db(stored[2], str(tmp_path / "cache.db"))
  db.execute(f"DELETE FROM '{reference['table']}' WHERE key IN (?, ?)", tuple(reference["sizes"]))
  db.commit()
  after_another = start_up(str(tmp_path / "cache.db"), 8, 16)
  assert after_another["scheduled_while_capturing"] > 0 and after_another["sizes"].keys() == reference["sizes"].keys()
  assert all(0 < after_another["sizes"][key] < 1.1 * size for key, size in reference["sizes"].items()), (reference, after_another)

def test_engines_of_other_flags_store_apart(tmp_path, stored):
  """Each engine configuration keeps its stored caches under its own key: under one key per model, every start also read what the other
  configurations had stored (the test suite's engines grew the bundled model's first-graphs entry to 4.6 MB, 1.3 s of a CPU start)."""
  reference = stored[0]
  copy_db(stored[2], str(tmp_path / "shared.db"))   # the engine's entries, then those of another token budget (8) in the same cache.db
  # the first engine again: it reads its entries back and, having nothing to add, stores nothing. Under one key per model the other
  # budget's engine had read them, added its own kernels and stored them back, and this one would read back twice as much
  after_another = start_up(str(tmp_path / "shared.db"), 16)
  assert after_another["sizes"].keys() == reference["sizes"].keys(), (reference, after_another)
  assert all(0 < after_another["sizes"][key] < 1.1 * size for key, size in reference["sizes"].items()), (reference, after_another)

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
