#!/bin/bash
# Issue #62's figures on one GPU, the working tree ("ours") against a baseline tree in the same lease (BASE, default .base: made here with
# `mkdir .base && git archive dd5872e tinyvllm scripts | tar -x -C .base`, carried as an ignored folder). Default flags throughout.
#   PART=check : scripts/check_async.py in both trees (greedy vs transformers' reference, eager and graphs; seeded/top-p/stop/max_tokens
#                outputs of a full batch with preemptions, compared token for token; no block leaked after aborts in flight)
#   PART=1b    : bench.py --latency, Llama-3.2-1B shape: ours, base, ours
#   PART=8b    : bench.py --latency, Llama-3.1-8B shape: ours, base
#   PART=serve : bench_serving.py --launch, 1B shape, TPOT at 1 / 8 / 32 streams: ours, base
#   PART=tp    : check_tp.py (ours, with a grammar case), then bench.py --latency --tensor-parallel-size 2, 8B shape (two GPUs): ours, base,
#                ours at N=1, ours at N=2 again
#   PART=moe   : bench.py --latency, Qwen3-30B-A3B shape (--kv-cache-memory 4, as its earlier rows): ours, base
#   PART=offline: bench.py --num-requests 256, 1B and 8B shapes: ours, base
source scripts/device_env.sh   # wheels into $SITE, ours / base
for part in ${PART:-check 1b}; do case $part in
check)
  ours scripts/check_async.py --eager > $OUT/check-ours.json 2> $OUT/check-ours.log; tail -4 $OUT/check-ours.log | grep -v "it/s"
  TREE=$BASE PYTHONPATH=$SITE python3 scripts/check_async.py --eager > $OUT/check-base.json 2> $OUT/check-base.log; tail -4 $OUT/check-base.log | grep -v "it/s"
  python3 -c "import json; a, b = (json.load(open('$OUT/check-' + n + '.json')) for n in ('ours', 'base')); print('CHECK ours == base:', a == b, {k: (v['greedy_ok'], v['leak_free']) for k, v in a.items()})";;
1b) for who in ours base ours; do echo "== $who 1B"; $who scripts/bench.py --config llama-3.2-1b --device CUDA --latency 2>&1 | grep -E "decode|TTFT|ready|SUMMARY"; done;;
8b) for who in ours base; do echo "== $who 8B"; $who scripts/bench.py --config llama-3.1-8b --device CUDA --latency 2>&1 | grep -E "decode|TTFT|SUMMARY"; done;;
serve) for who in ours base; do echo "== $who server"; $who scripts/bench_serving.py --launch --config llama-3.2-1b --device CUDA --output-len 256 --concurrency 1 8 32 2>&1 | grep -iE "tpot|ttft|tok/s|fail" | tail -12; done;;
tp) ours scripts/check_tp.py --device CUDA 2>&1 | grep -E "EQUAL|DIFFER|Error|up after"
    for who in ours base; do echo "== $who 8B tp2"; $who scripts/bench.py --config llama-3.1-8b --device CUDA --latency --tensor-parallel-size 2 2>&1 | grep -E "decode|TTFT|SUMMARY"; done
    echo "== ours 8B tp1"; ours scripts/bench.py --config llama-3.1-8b --device CUDA --latency 2>&1 | grep -E "decode|TTFT|SUMMARY"
    echo "== ours 8B tp2"; ours scripts/bench.py --config llama-3.1-8b --device CUDA --latency --tensor-parallel-size 2 2>&1 | grep -E "decode|TTFT|SUMMARY";;
moe) for who in ours base; do echo "== $who Qwen3-30B-A3B"; $who scripts/bench.py --config qwen3-30b-a3b --device CUDA --latency --kv-cache-memory 4 2>&1 | grep -E "decode|TTFT|ready|SUMMARY"; done;;
offline) for cfg in llama-3.2-1b llama-3.1-8b; do for who in ours base; do echo "== $who $cfg offline"; $who scripts/bench.py --config $cfg --device CUDA --num-requests 256 2>&1 | grep -E "tok/s|SUMMARY"; done; done;;
esac; done
