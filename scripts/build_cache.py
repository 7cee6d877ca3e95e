#!/usr/bin/env python3
"""Rebuild the shipped tinygrad cache (tinyvllm/tinygrad-cache-sm90.sql.xz) with only what today's code uses.

The file ships in the package, and the engine applies it on its first start on an sm_90 GPU (ModelRunner.load): it is SQL, xz'd,
that creates tinygrad's cache.db tables if they are missing and inserts only the rows cache.db lacks (CREATE TABLE IF NOT EXISTS,
INSERT OR IGNORE), so nothing a user's own cache holds is ever overwritten. Until 2026-11-25 it was a gzipped cache.db in scripts/ that
users had to unpack by hand (2.2 MB; the same rows as SQL are 0.3 MB xz'd).

tinygrad's cache.db only grows: the shipped one held every kernel that any earlier version of the engine had compiled (7,665 CUDA
binaries, 16 MB gzipped, until 2026-11-23), so there was no room left in it for the schedules and lowered programs that
ModelRunner.capture_graphs stores (with them a fresh machine would start as fast as a warm one). This starts from an empty cache.db that
keeps only the BEAM search results of the old one (small, and slow to search again), starts each benchmark engine once (bench.py, one
tiny request), and writes the result gzipped. --without-stored leaves out the stored schedules and programs, for when they do not fit.

On the H100 on 2026-11-23 the two Llama-3.2-1B engines gave 1.5 MB without the stored schedules and 27.7 MB with them (45.6 MB of
pickles): too big to ship. The shipped file is the 1.5 MB one extended by the Llama-3.1-8B benchmark runs (throughput, and batch 1 with
BEAM 2). Rebuilt that way on 2026-11-24 for 6b453a5's attention kernels (the first command below with --without-stored, then the
second): 2.2 MB gzipped, 1,310 binaries, 121 BEAM results.

Rebuilt on 2026-11-26 for d550d11 (the GEMV with experts, the tiles' matmul): the first command below, then the 30B engine added with
the fourth (0.42 MB: 1,835 sm_90 and 84 sm_90a binaries, 164 BEAM results). tests/test_startup.py renders today's GEMV for sm_90 and
fails while the shipped file lacks it: a change to a kernel comes with a rebuild (one H100 call, ~7 minutes for these two). Rebuilt so
again on 2026-11-26 for a834caf (the sampler's argmax, q/k/v read in place), in two calls (the second command alone took 256 s): 0.61 MB,
1,928 sm_90 and 84 sm_90a binaries, 176 BEAM results. Rebuilt so for f659d84 (the wgmma kernel with an expert per tile; every wgmma
kernel's source changed), two calls of 245 s and 338 s: 0.44 MB, 1,586 sm_90 and 90 sm_90a binaries, 176 BEAM results.
Rebuilt so for 9970ecc (the MoE routing counted per token; on Hopper the 30B's steps from 64 tokens take the wgmma tiles), two
calls of 198 s and 259 s: 0.44 MB, 1,611 sm_90 and 96 sm_90a binaries, 176 BEAM results.
Rebuilt so for the MoE padding tiles skipped by the wgmma kernel (every wgmma kernel's source changed), both commands in one call
(225 s and 319 s): 0.44 MB, 1,611 sm_90 and 96 sm_90a binaries, 176 BEAM results.
Rebuilt so for the attention merge's weighted sum in two rounds (new tinygrad kernels in every small decode step), two calls of 245 s
and 328 s: 0.50 MB, 1,932 sm_90 and 96 sm_90a binaries, 178 BEAM results.

  python scripts/build_cache.py --device CUDA --without-stored   # the Llama-3.2-1B engines of BENCHMARKS.md's throughput and latency commands
  python scripts/build_cache.py --device CUDA --config llama-3.1-8b --extend --without-stored   # add the 8B engines to the shipped file
  python scripts/build_cache.py --device CUDA --config qwen3-30b-a3b --extend --without-stored --engine "--kv-cache-memory 4"   # the MoE's
  python scripts/build_cache.py --device CPU --config "" --engine "--max-num-seqs 8 --max-num-batched-tokens 64" --out /tmp/cpu.sql.xz

--old and --extend read the shipped .sql.xz or a cache.db (gzipped or not); --out is always the shipped format.
"""
import argparse, gzip, lzma, os, shutil, sqlite3, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SHIPPED = os.path.join(os.path.dirname(HERE), "tinyvllm", "tinygrad-cache-sm90.sql.xz")
# the engine shapes of BENCHMARKS.md's throughput and latency commands, as bench.py's flags
ENGINES = ["--kv-cache-memory 40", "--kv-cache-memory 40 --max-num-seqs 1 --max-num-batched-tokens 1024 --beam 2"]

def table_sizes(db:sqlite3.Connection) -> dict[str, tuple[int, int]]:
  tables = [t for (t,) in db.execute("select name from sqlite_master where type='table'")]
  return {t: db.execute(f"select count(*), coalesce(sum(length(val)), 0) from '{t}'").fetchone() for t in tables}

def read_cache(path:str, db_file:str):
  """A shipped .sql.xz, or a cache.db gzipped or not, as the database file db_file."""
  if path.endswith(".sql.xz"):
    with sqlite3.connect(db_file) as db, lzma.open(path, "rt") as sql: db.executescript(sql.read())
  else:
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as src, open(db_file, "wb") as dst: shutil.copyfileobj(src, dst)

def write_shipped(db_file:str, out:str):
  """The database as the SQL the engine applies: tables created if missing, rows inserted only where cache.db lacks them."""
  with sqlite3.connect(db_file) as db, lzma.open(out, "wt", preset=9 | lzma.PRESET_EXTREME) as sql:
    for statement in db.iterdump():
      # BEGIN IMMEDIATE takes the write lock first, waiting for it: replicas that start at once each apply the file, and a deferred
      # transaction that read the schema before another process wrote failed at once with "database is locked"
      for plain, kept in (("CREATE TABLE ", "CREATE TABLE IF NOT EXISTS "), ("INSERT INTO ", "INSERT OR IGNORE INTO "),
                          ("BEGIN TRANSACTION;", "BEGIN IMMEDIATE;")):
        if statement.startswith(plain): statement = kept + statement[len(plain):]
      sql.write(statement + "\n")

def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--device", default="CUDA")
  p.add_argument("--config", default="llama-3.2-1b", help="a scripts/configs folder; empty for the bundled model")
  p.add_argument("--old", default=SHIPPED, help="the cache whose BEAM results are kept (the shipped .sql.xz, or a cache.db gzipped or not)")
  p.add_argument("--out", default=SHIPPED)
  p.add_argument("--engine", action="append", help=f"bench.py's engine flags, once per engine to start (default: {ENGINES})")
  p.add_argument("--without-stored", action="store_true", help="drop the tinyvllm_* tables (stored schedules and programs)")
  p.add_argument("--extend", action="store_true", help="keep all of --old (compiled kernels too) and add these engines' kernels to it")
  args = p.parse_args()
  work = tempfile.mkdtemp(prefix="tinyvllm-cache-")
  old, new = os.path.join(work, "old.db"), os.path.join(work, "cache.db")
  read_cache(args.old, old)
  db = sqlite3.connect(new)
  db.execute("attach database ? as old", (old,))
  kept = "name not like 'tinyvllm%'" if args.extend else "name like 'beam_search%'"
  for (table, sql) in db.execute(f"select name, sql from old.sqlite_master where type='table' and {kept}").fetchall():
    db.execute(sql); db.execute(f"insert into '{table}' select * from old.'{table}'")
  db.commit(); db.execute("detach database old"); db.close()
  tiny = "--num-requests 1 --min-input 8 --max-input 16 --min-output 2 --max-output 4"
  # the engine applies the shipped file to cache.db when it starts on an sm_90 GPU; here it must not (only what today's engines use is
  # kept), so bench.py runs with the engine pointed at an empty one
  with lzma.open(empty := os.path.join(work, "empty.sql.xz"), "wt"): pass
  without_shipped = ("import runpy, sys, tinyvllm.model_runner as runner; runner.SHIPPED_CACHE = sys.argv.pop(1); sys.argv.pop(0); "
                     "runpy.run_path(sys.argv[0], run_name='__main__')")
  env = {**os.environ, "CACHEDB": new, "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])}
  for flags in args.engine or ENGINES:
    cmd = [os.path.join(HERE, "bench.py"), "--device", args.device, *tiny.split(), *flags.split()]
    if args.config: cmd += ["--config", args.config]
    print("$", " ".join(cmd), flush=True)
    subprocess.run([sys.executable, "-c", without_shipped, empty, *cmd], check=True, env=env)
  db = sqlite3.connect(new)
  if args.without_stored:
    for table in [t for t in table_sizes(db) if t.startswith("tinyvllm")]: db.execute(f"drop table '{table}'")
    db.commit()
  db.execute("vacuum")
  for table, (rows, size) in table_sizes(db).items(): print(f"{table}: {rows} rows, {size / 1e6:.1f} MB of values")
  db.close()
  write_shipped(new, args.out)
  print(f"{args.out}: {os.path.getsize(args.out) / 1e6:.2f} MB (SQL, xz)")
  shutil.rmtree(work)

if __name__ == "__main__": main()
