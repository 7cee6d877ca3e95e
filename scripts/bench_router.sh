#!/bin/bash
# Issue #61's GPU figures (after #56's): tinyvllm replicas behind vllm-router on two GPUs, Llama-3.2-1B shape (dummy weights), default
# engine flags, serve_replicas.py's router (cache_aware with its thresholds); every client is ONE bench_serving.py / bench_prefix.py process.
#  a. one replica direct (CUDA_VISIBLE_DEVICES=0): output tok/s at $STREAMS streams, TTFT p50 at concurrency 1
#  b. two replicas (scripts/serve_replicas.py --gpus 0 1) behind vllm-router: cache_aware on :8000 (serve_replicas' router), round_robin
#     on :8001 (a second router in front of the same replicas): output tok/s at $STREAMS streams through :8000, then $STREAMS8 streams,
#     and the requests the router sent each replica in each (its Prometheus counts); TTFT p50 at concurrency 1 alternated between
#     replica 0 direct, :8000 and :8001, twice, in the same run
#  c. scripts/bench_prefix.py, $USERS users x $SYS_TOKENS-word system prompts x $TURNS turns, through cache_aware (seed 1), then
#     round_robin (seed 2: other prompts, so the first run's cache gives the second no hits): hit rates per replica and summed
#  d. only with KILL=1: SIGKILL replica 1 while $KILL_CONC streams run through :8000: failures, later answers, and when the router
#     stopped sending it work (the victim's samples in the router's Prometheus metrics)
#  CLIENTS=N (N > 1) also measures a. and b. at $STREAMS streams with N client processes at once (one Python client may be the bottleneck)
# The last lines are a summary table against #61's targets. From the repo root, on a machine with two GPUs and `pip install vllm-router`:
# bash scripts/bench_router.sh   (logs: $OUT/logs.tgz, default /tmp/out). The device machines here have no network: wheels in .whl/
# (tinygrad, llguidance, starlette, uvicorn) and .whl-router/ (vllm-router, and httpx where it is missing) are installed into $SITE when
# those folders exist.
# CPU smoke (bundled model, small sizes):
#   DEV=CPU CONFIG= SITE=/tmp/site-smoke OUT=/tmp/out-smoke STREAMS=8 NUM_PROMPTS=16 STREAMS8=4 NUM_PROMPTS8=8 OUTPUT_LEN=16 \
#   INPUT_WORDS=30 TTFT_PROMPTS=8 USERS=2 SYS_TOKENS=40 TURNS=3 MAX_TOKENS=8 KILL=1 KILL_CONC=4 KILL_AT=6 KILL_END=15 KILL_TOKENS=32 \
#   BUDGET=1500 bash scripts/bench_router.sh
unset PYTHONDONTWRITEBYTECODE; export PIP_ROOT_USER_ACTION=ignore
SITE=${SITE:-/tmp/site} FINAL=${OUT:-/tmp/out}; OUT=$(mktemp -d /tmp/elog.XXXX); mkdir -p $FINAL   # logs: one tarball in $FINAL at the end
export PYTHONFAULTHANDLER=1   # a SIGABRT dumps every thread (a server that does not exit on SIGTERM)
[ ! -d .whl ] || python3 -m pip install -q --no-index --no-deps --upgrade --target $SITE .whl/*.whl || exit 1
export PYTHONPATH=$SITE:$PWD
export DEV=${DEV:-CUDA} PYTHONUNBUFFERED=1
CONFIG=${CONFIG-llama-3.2-1b} GPUS=${GPUS:-0 1} BUDGET=${BUDGET:-540}   # seconds for the whole script: a step's timeout is what is left
STREAMS=${STREAMS:-64} CLIENTS=${CLIENTS:-1} NUM_PROMPTS=${NUM_PROMPTS:-320} OUTPUT_LEN=${OUTPUT_LEN:-256} INPUT_WORDS=${INPUT_WORDS:-100}
STREAMS8=${STREAMS8:-8} NUM_PROMPTS8=${NUM_PROMPTS8:-64}
TTFT_PROMPTS=${TTFT_PROMPTS:-100} TTFT_OUTPUT_LEN=${TTFT_OUTPUT_LEN:-16}
USERS=${USERS:-8} SYS_TOKENS=${SYS_TOKENS:-2000} TURNS=${TURNS:-8} MAX_TOKENS=${MAX_TOKENS:-32}
KILL=${KILL:-0} KILL_CONC=${KILL_CONC:-32} KILL_AT=${KILL_AT:-8} KILL_END=${KILL_END:-30} KILL_TOKENS=${KILL_TOKENS:-128}
say() { echo "=== $(date +%T) +${SECONDS}s $*"; }
cap() { local left=$((BUDGET - SECONDS)); echo $(($1 < left ? $1 : (left > 3 ? left : 3))); }   # a step's timeout: at most what is left
nvidia-smi -L 2>/dev/null; python3 -V

# vllm-router from its wheel (a Rust extension under a Python launcher, whose imports of setproctitle and of the --mini-lb mode's
# aiohttp/fastapi/orjson are stubbed where missing); httpx and its dependencies only where it is missing (bench_serving.py and
# bench_prefix.py use it when openai is not installed): here only where .whl-router/ exists, else the installed vllm-router
if [ -d .whl-router ]; then
python3 -m pip install -q --no-index --no-deps --upgrade --target $SITE .whl-router/vllm_router-*.whl || exit 1
python3 -c "import httpx" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --upgrade --target $SITE $(ls .whl-router/*.whl | grep -v vllm_router) || exit 1
mkdir -p $SITE/bin && cat > $SITE/bin/vllm-router <<SHIM && chmod +x $SITE/bin/vllm-router && export PATH=$SITE/bin:$PATH
#!$(command -v python3)
import sys, types
try: import setproctitle
except ImportError: sys.modules["setproctitle"] = types.SimpleNamespace(setproctitle=lambda title: None)
try: import vllm_router.mini_lb
except ImportError: sys.modules["vllm_router.mini_lb"] = types.SimpleNamespace(MiniLoadBalancer=None)
from vllm_router.launch_router import main
sys.exit(main())
SHIM
fi
vllm-router --help > /dev/null || { echo "vllm-router does not start"; exit 1; }
python3 -c "import openai" 2>/dev/null && echo "client: openai" || echo "client: httpx (no openai)"

# the model: CONFIG's dummy weights with Llama 3's tokenizer, made once here; or MODEL_ARGS as given (neither: the bundled model)
if [ -n "$CONFIG" ] && [ -z "$MODEL_ARGS" ]; then
  MODEL_ARGS="--model $(python3 -c "import sys, types; sys.path.insert(0, '.'); from scripts.bench import model_folder
print(model_folder(types.SimpleNamespace(config='$CONFIG', model=None))[0])" 2>$OUT/model.log | tail -1) --load-format dummy"
fi
[[ "$MODEL_ARGS" != "--model  "* ]] || { echo "no model folder for $CONFIG:"; tail -3 $OUT/model.log; exit 1; }
echo "model args: ${MODEL_ARGS:-(the bundled model)}"

cat > $OUT/kill_under_load.py <<'PY'
# SIGKILL one replica while streams run through the router: how many requests fail, whether later ones are answered, and when the router
# stopped sending the dead replica work (the victim's samples in the router's Prometheus metrics, polled every 0.05 s).
# usage: python3 kill_under_load.py ROUTER_URL ROUTER_METRICS_URL VICTIM_URL VICTIM_PID CONCURRENCY KILL_AT_S END_S MAX_TOKENS
import asyncio, json, os, re, signal, sys, time
import httpx
url, prom, victim, pid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
conc, kill_at, end, max_tokens = int(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7]), int(sys.argv[8])
reqs, samples, t0, kill = [], [], time.monotonic(), []   # reqs: (sent, ended, error or None), seconds since t0

async def one(hc, model:str, i:int):
  start, err, finish, n = time.monotonic() - t0, None, None, 0
  body = {"model": model, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
          "messages": [{"role": "user", "content": f"{i} Once upon a time there was a little dog who"}]}
  try:
    async with hc.stream("POST", "/v1/chat/completions", json=body) as r:
      if r.status_code != 200: raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
      async for line in r.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]": continue
        if "error" in (obj := json.loads(line[6:])): raise RuntimeError(f"error event: {obj['error']}")
        if obj.get("choices"): n, finish = n + 1, obj["choices"][0].get("finish_reason") or finish
    if finish != "length": err = f"Cut: after {n} chunks, without an error"
  except Exception as e: err = f"{type(e).__name__}: {e}"[:200]
  reqs.append((start, time.monotonic() - t0, err))

async def main():
  async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=conc + 4)) as hc, httpx.AsyncClient(timeout=5) as pc:
    model, count = (await hc.get("/v1/models")).json()["data"][0]["id"], iter(range(10**9))
    async def worker():
      while time.monotonic() - t0 < end: await one(hc, model, next(count))
    async def poll():
      while time.monotonic() - t0 < end + 3:
        if not kill and time.monotonic() - t0 >= kill_at: os.kill(pid, signal.SIGKILL); kill.append(time.monotonic() - t0)
        try: samples.append((time.monotonic() - t0, {m[1]: float(m[2]) for m in re.finditer(r"^(vllm_router_\S*) (\S+)$",
                                                     (await pc.get(prom)).text, re.M) if f'"{victim}"' in m[1]}))
        except httpx.HTTPError: pass
        await asyncio.sleep(0.05)
    await asyncio.gather(poll(), *(worker() for _ in range(conc)))
asyncio.run(main())

t_kill, last, first, routed = kill[0], {}, {}, []   # when each of the victim's samples last changed, how it first changed after the kill,
for (_, a), (tb, b) in zip(samples, samples[1:]):  # and every poll after the kill at which the router had sent it requests since the last
  for k in [k for k in b if a.get(k) != b[k]]:
    last[k] = tb
    if tb > t_kill: first.setdefault(k, [round(tb - t_kill, 2), a.get(k), b[k]])
    if tb > t_kill and k.startswith("vllm_router_processed_requests_total"): routed.append([round(tb - t_kill, 2), b[k] - (a.get(k) or 0)])
sent = [t for k, t in last.items() if k.startswith(("vllm_router_processed_requests_total", "vllm_router_cb_outcomes_total"))]
fails, in_flight, after = [r for r in reqs if r[2]], [r for r in reqs if r[0] < t_kill < r[1]], [r for r in reqs if r[0] >= t_kill]
for r in sorted(fails): print(f"failed: sent {r[0] - t_kill:+.2f} s, ended {r[1] - t_kill:+.2f} s from the kill: {r[2]}")
print("the victim's router samples, first change after the kill [s, before, after]:", json.dumps(first))
print("KILL " + json.dumps({
  "concurrency": conc, "max_tokens": max_tokens, "kill_at_s": round(t_kill, 2), "window_s": end, "requests": len(reqs), "failed": len(fails),
  "in_flight_at_kill": len(in_flight), "in_flight_failed": sum(1 for r in in_flight if r[2]), "sent_after_kill": len(after),
  "sent_after_kill_failed": sum(1 for r in after if r[2]), "sent_after_kill_ok": sum(1 for r in after if not r[2]),
  "last_failure_ended_s_after_kill": round(max(r[1] for r in fails) - t_kill, 2) if fails else None,
  "victim_last_sent_work_s_after_kill": round(max(sent) - t_kill, 2) if sent else None,   # negative: nothing sent to it after the kill
  "victim_routed_after_kill_s_count": routed[:20],
  "victim_cb_open_s_after_kill": next((v[0] for k, v in first.items() if k.startswith("vllm_router_cb_state{")), None),
  "victim_unhealthy_s_after_kill": next((v[0] for k, v in first.items() if k.startswith("vllm_router_worker_health{")), None),
  "failure_kinds": sorted({r[2].split(":")[0] for r in fails})}))
PY

APID= CPID= RPID=
cleanup() { for p in $RPID $CPID $APID; do kill -TERM $p 2>/dev/null; done; for p in $RPID $CPID $APID; do wait $p 2>/dev/null; done; }
trap cleanup EXIT
waitfor() {   # SECONDS PID PATTERN FILE...: until every FILE has a line matching PATTERN, while PID lives
  local end=$((SECONDS + $1)) pid=$2 pat=$3; shift 3
  for f; do
    until grep -qE "$pat" $f 2>/dev/null; do
      kill -0 $pid 2>/dev/null || { echo "process $pid exited before '$pat' in $f"; return 1; }
      [ $SECONDS -lt $end ] || { echo "no '$pat' in $f in time"; return 1; }; sleep 0.5
    done
  done
}
CAPTURED="all [0-9]+ step graph units captured| 0 more to capture"
TIMEFORMAT="client: wall %R s, cpu %U s user + %S s sys"
bs() {   # NAME URL ARGS...: one bench_serving.py run, its log in $OUT/NAME.log
  local name=$1 url=$2; shift 2
  { time timeout $(cap 150) python3 scripts/bench_serving.py --url $url --input-words $INPUT_WORDS "$@"; } > $OUT/$name.log 2>&1
  echo "$name: rc=$? $(grep -hE '^SUMMARY|ok, .* failed|^client: wall' $OUT/$name.log | sed 's/^SUMMARY | serving | //' | tr '\n' ' ')"
}
tput() {   # NAME URL: output tok/s at $STREAMS streams, one client process; with CLIENTS > 1, then $CLIENTS processes of $STREAMS/$CLIENTS
  bs $1 $2 --concurrency $STREAMS --num-prompts $NUM_PROMPTS --output-len $OUTPUT_LEN
  [ "$CLIENTS" -gt 1 ] || return 0
  local pids=() k
  for k in $(seq 1 $CLIENTS); do
    bs $1-x$CLIENTS-$k $2 --concurrency $((STREAMS / CLIENTS)) --num-prompts $((NUM_PROMPTS / CLIENTS)) --output-len $OUTPUT_LEN \
      --seed $k & pids+=($!)
  done
  wait ${pids[@]}
}
ttft() { bs $1 $2 --concurrency 1 --num-prompts $TTFT_PROMPTS --output-len $TTFT_OUTPUT_LEN; }
routed() {   # PROMETHEUS_URL: the requests the router has sent replica 0 and replica 1 so far
  python3 -c "import re, sys, urllib.request; t = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
print(*(int(sum(float(v) for v in re.findall(r'^vllm_router_processed_requests_total\{worker=\"http://127.0.0.1:%d\"\} (\S+)' % p, t, re.M)))
        for p in (8100, 8101)))" $1
}
per_replica() {   # NAME COMMAND...: COMMAND, and the requests :8000 sent each replica meanwhile (warm-up rounds too), in $OUT/split-NAME.txt
  local name=$1 before; shift; before=$(routed http://127.0.0.1:29000/metrics); "$@"
  echo "$before $(routed http://127.0.0.1:29000/metrics)" > $OUT/split-$name.txt
  echo "requests per replica: $(awk '{print $3 - $1, $4 - $2}' $OUT/split-$name.txt)"
}

say "a. one replica direct, CUDA_VISIBLE_DEVICES=0 (on a fresh machine this start compiles every graph: ~3 min on an H100)"
CUDA_VISIBLE_DEVICES=0 python3 -m tinyvllm.serve $MODEL_ARGS --device $DEV --port 8100 > $OUT/a-server.log 2>&1 & APID=$!
if waitfor $(cap 330) $APID "$CAPTURED" $OUT/a-server.log; then
  grep -hE "ready after|step graph units captured" $OUT/a-server.log | cut -c1-160; say "measuring"
  tput a-tput http://127.0.0.1:8100; ttft a-ttft http://127.0.0.1:8100
else tail -5 $OUT/a-server.log; fi
stop() {   # PID NAME: SIGTERM, and how long the exit takes; after 15 s a SIGABRT (faulthandler's dump of every thread), then SIGKILL
  local t=$SECONDS; kill -TERM $1
  while kill -0 $1 2>/dev/null && [ $((SECONDS - t)) -lt 15 ]; do sleep 0.2; done
  if kill -0 $1 2>/dev/null; then echo "$2: still running 15 s after SIGTERM: SIGABRT, SIGKILL"; kill -ABRT $1; sleep 2; kill -9 $1 2>/dev/null
  else echo "$2: exited $((SECONDS - t)) s after SIGTERM"; fi; wait $1; echo "$2: rc=$?"
}
stop $APID "replica alone"; APID=; grep -A30 -E "Fatal Python error|Thread 0x|Current thread" $OUT/a-server.log | head -60 | cut -c1-200

say "b. two replicas (--gpus $GPUS) behind vllm-router: cache_aware :8000 (serve_replicas.py's flags), round_robin :8001"
timeout $(cap 420) python3 scripts/serve_replicas.py --gpus $GPUS --device $DEV $MODEL_ARGS --policy cache_aware \
  --router-args "--prometheus-port 29000" --log-dir $OUT/cluster > $OUT/cluster.log 2>&1 & CPID=$!
waitfor $(cap 240) $CPID "^ready on" $OUT/cluster.log && waitfor $(cap 120) $CPID "$CAPTURED" $OUT/cluster/replica-{0,1}.log
cat $OUT/cluster.log; grep -hE "ready after|step graph units captured" $OUT/cluster/replica-*.log | cut -c1-160
timeout $(cap 400) vllm-router --host 127.0.0.1 --port 8001 --worker-urls http://127.0.0.1:8100 http://127.0.0.1:8101 --policy round_robin \
  --prometheus-port 29001 > $OUT/router-rr.log 2>&1 & RPID=$!
python3 -c "import time, urllib.request
for _ in range(100):
  try: urllib.request.urlopen('http://127.0.0.1:8001/health', timeout=2); break
  except OSError: time.sleep(0.3)"; tail -2 $OUT/router-rr.log | cut -c1-200
say "measuring"
per_replica streams tput b-tput http://127.0.0.1:8000
per_replica streams8 bs b-tput8 http://127.0.0.1:8000 --concurrency $STREAMS8 --num-prompts $NUM_PROMPTS8 --output-len $OUTPUT_LEN
for r in 1 2; do ttft ttft-direct-$r http://127.0.0.1:8100; ttft ttft-ca-$r http://127.0.0.1:8000; ttft ttft-rr-$r http://127.0.0.1:8001; done

say "c. prefix-cache hit rate: $USERS users x $SYS_TOKENS-word system prompts x $TURNS turns"
for p in "ca 8000 29000 1 cache_aware" "rr 8001 29001 2 round_robin"; do set -- $p
  timeout $(cap 150) python3 scripts/bench_prefix.py --url http://127.0.0.1:$2 --replica-urls http://127.0.0.1:8100 http://127.0.0.1:8101 \
    --router-metrics http://127.0.0.1:$3/metrics --users $USERS --sys-tokens $SYS_TOKENS --turns $TURNS --max-tokens $MAX_TOKENS \
    --seed $4 --label $5 > $OUT/prefix-$1.log 2>&1; echo "rc=$?"; grep -vE "^\{" $OUT/prefix-$1.log | tail -4
done
kill -TERM $RPID; wait $RPID; RPID=

if [ "$KILL" = 1 ]; then
say "d. SIGKILL replica 1 under load: $KILL_CONC streams through :8000, killed at ${KILL_AT} s of ${KILL_END} s"
VICTIM=$(sed -n 's/^replica 1: pid \([0-9]*\).*/\1/p' $OUT/cluster.log)
timeout $(cap $((KILL_END + 60))) python3 $OUT/kill_under_load.py http://127.0.0.1:8000 http://127.0.0.1:29000/metrics http://127.0.0.1:8101 \
  $VICTIM $KILL_CONC $KILL_AT $KILL_END $KILL_TOKENS > $OUT/kill.log 2>&1; echo "rc=$?"; tail -3 $OUT/kill.log | cut -c1-700
echo "router: requests per replica so far $(routed http://127.0.0.1:29000/metrics)"
fi
t=$SECONDS; kill -TERM $CPID; wait $CPID; echo "serve_replicas.py stopped: rc=$? after $((SECONDS - t)) s"; CPID=
grep -ciE "traceback" $OUT/*.log $OUT/cluster/*.log | grep -v ":0$"

say "summary"
trap - EXIT; tar czf $FINAL/logs.tgz -C $OUT . && echo "logs: logs.tgz"
OUT=$OUT STREAMS=$STREAMS STREAMS8=$STREAMS8 CLIENTS=$CLIENTS python3 - <<'PY'
import glob, json, os, re
out, s, s8, k = os.environ["OUT"], os.environ["STREAMS"], os.environ["STREAMS8"], int(os.environ["CLIENTS"])
grab = lambda name, pat: [float(m[1]) for f in sorted(glob.glob(f"{out}/{name}.log")) for m in re.finditer(pat, open(f).read())]
tok = lambda name: sum(grab(name, r"SUMMARY .*\| ([\d.]+) out tok/s"))
p50 = lambda name: grab(name, r"SUMMARY .*TTFT p50 ([\d.]+) ms")
mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
def split(n):
  try: b0, b1, a0, a1 = map(int, open(f"{out}/split-{n}.txt").read().split())
  except Exception as e: return f"no counts ({e})"
  r = [a0 - b0, a1 - b1]
  return f"{r[0]} / {r[1]} ({r[0] / max(1, sum(r)):.0%} / {r[1] / max(1, sum(r)):.0%})"
def prefix(p):
  try: j = json.loads(open(f"{out}/prefix-{p}.log").read().strip().splitlines()[-1])
  except Exception as e: return f"no summary ({e})"
  return f"{j['hit_rate']:.1%} (best possible {j['best_rate']:.1%}; {j['ok']} ok, {j['failed']} failed; requests {j['requests']})"
log = open(f"{out}/cluster.log").read().splitlines() if os.path.exists(f"{out}/cluster.log") else []
flags = [l.split("(", 1)[1].rstrip(")") for l in log if l.startswith("router: pid")]
kill = [l for l in open(f"{out}/kill.log").read().splitlines() if l.startswith("KILL ")] if os.path.exists(f"{out}/kill.log") else []
if kill: print(kill[-1])
a, b = tok("a-tput"), tok("b-tput")
d, ca, rr = p50("ttft-direct-*"), p50("ttft-ca-*"), p50("ttft-rr-*")
print(f"router :8000: {flags[0] if flags else '?'}")
print("| figure | 1 replica direct | 2 replicas, cache_aware (:8000) | ratio / difference | target |")
print("|---|---|---|---|---|")
print(f"| output tok/s, {s} streams, one client | {a:.1f} | {b:.1f} | {b / max(a, 1e-9):.2f}x | >= 1.5x |")
if k > 1: print(f"| same, {k} clients at once | {tok(f'a-tput-x{k}-*'):.1f} | {tok(f'b-tput-x{k}-*'):.1f} | "
                f"{tok(f'b-tput-x{k}-*') / max(tok(f'a-tput-x{k}-*'), 1e-9):.2f}x | |")
print(f"| requests per replica, {s8} streams | | {split('streams8')} | | each 40-60% |")
print(f"| requests per replica, {s} streams | | {split('streams')} | | each 40-60% |")
print(f"| prefix hit rate, bench_prefix.py, summed over the replicas | | {prefix('ca')} | round_robin {prefix('rr')} | >= 85% |")
print(f"| TTFT p50, 1 stream (replica 0 direct, :8000, round_robin :8001 alternated, 2 rounds) | {d} ms | {ca} ms | "
      f"{mean(ca) - mean(d):+.1f} ms (round_robin {rr} ms: {mean(rr) - mean(d):+.1f}) | <= +2 ms |")
print(f"(one replica alone before the cluster: TTFT p50 {p50('a-ttft')} ms)")
PY
