#!/bin/bash
# This round's GPU figures (issues #69-#73) on one GPU: the working tree ("ours") against a baseline tree in the same lease (BASE, default
# .base: `mkdir .base && git archive aefee24 tinyvllm scripts tests/data/llama3-tiktoken | tar -x -C .base`, carried as an ignored folder:
# without tests/data, scripts/bench.py's model folders give the base tree the bundled model's 512-token tokenizer). Default flags throughout.
#   PART=instep  : scripts/bench_instep.py, the dense in-step attention's variants (issue #71)
#   PART=prefill : profile_decode.py --prefill, one 1024-token step, 1B and 8B shapes (issue #71 item 1)
#   PART=fresh   : bench_serving.py --launch --from-ready 12 at 1 2 4 8 16 streams then settled, 1B shape, empty cache.db (issue #70 item 2):
#                  ours, base
#   PART=latency : bench.py --latency, 1B (ours, base, ours) and 8B (ours, base)
#   PART=variants: scripts/instep_variants.py's trees, each profiled inside the engine (1B prefill step), and today's with --step-beam 2
#   PART=lat1b   : bench.py --latency, 1B, ours then base
#   PART=health  : /health of a fresh server (an empty cache.db), base and ours in turns, twice (issue #70 item 2)
#   PART=healthsampled: the same once each, every thread's stack sampled every 20 ms into $OUT/<who>/ (scripts/stack_sampler)
#   PART=cl32    : the cl part's float32 runs alone
#   PART=cl16    : the cl part's float16 bench.py runs alone, CL then CUDA
#   PART=cl      : the engine on tinygrad's OpenCL backend (NVIDIA's driver) beside CUDA: bundled model greedy tokens; 1B float16 and
#                  float32 decode and TTFT(1024) (issue #69)
source scripts/device_env.sh   # wheels into $SITE, ours / base
for part in ${PART:-instep}; do case $part in
instep) ours scripts/bench_instep.py --device CUDA 2>&1 | grep -v "^\s*$" | tail -12;;
prefill) for cfg in llama-3.2-1b llama-3.1-8b; do echo "== ours $cfg prefill 1024"
    ours scripts/profile_decode.py --config $cfg --device CUDA --batch 1 --ctx 1024 --prefill --kv-cache-memory 4 --top 16 2>&1 | tail -22; done;;
fresh) for who in ours base; do echo "== $who server from ready"   # base: /health and one stream only (aefee24's is the issue's table)
    [ $who = ours ] && levels="1 2 4 8 16" || levels=1
    CACHEDB=/tmp/fresh-$who.db $who scripts/bench_serving.py --launch --config llama-3.2-1b --device CUDA --output-len 256 --from-ready 12 \
      --concurrency $levels 2>&1 | grep -E "SUMMARY|healthy after|captured after|fail"; done;;
latency) for who in ours base ours; do echo "== $who 1B"; $who scripts/bench.py --config llama-3.2-1b --device CUDA --latency 2>&1 | grep -E "SUMMARY"; done
    for who in ours base; do echo "== $who 8B"; $who scripts/bench.py --config llama-3.1-8b --device CUDA --latency 2>&1 | grep -E "SUMMARY"; done;;
cl) mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd; export OCL_ICD_VENDORS=/tmp/icd
    for dev in CUDA CL; do ours scripts/check_backends.py --device $dev 2>&1 | grep '^{'; done
    for dt in float16 float32; do for dev in CUDA CL; do
      ours scripts/check_backends.py --device $dev --config llama-3.2-1b --dtype $dt --tokens 24 --enforce-eager 2>&1 | grep -E '^\{|Error' | tail -2; done; done
    for dt in float16 float32; do for dev in CL CUDA; do echo "== ours 1B $dt on $dev"
      DEV=$dev ours scripts/bench.py --config llama-3.2-1b --device $dev --dtype $dt --latency --copy-gib 0.25 2>&1 | grep -E "SUMMARY|Error" | tail -3; done; done;;
cl32) mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd; export OCL_ICD_VENDORS=/tmp/icd   # float32 only, CUDA beside
    for dev in CUDA CL; do ours scripts/check_backends.py --device $dev --config llama-3.2-1b --dtype float32 --tokens 24 --enforce-eager 2>&1 | grep -E '^\{|Error' | tail -2; done
    for dev in CL CUDA; do echo "== ours 1B float32 on $dev"
      DEV=$dev ours scripts/bench.py --config llama-3.2-1b --device $dev --dtype float32 --latency --copy-gib 0.25 2>&1 | grep -E "SUMMARY|Error" | tail -3; done;;
cl16) mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd; export OCL_ICD_VENDORS=/tmp/icd   # float16 only, CUDA beside
    for dev in CL CUDA; do echo "== ours 1B float16 on $dev"
      DEV=$dev ours scripts/bench.py --config llama-3.2-1b --device $dev --dtype float16 --latency --copy-gib 0.25 2>&1 | grep -E "SUMMARY|Error" | tail -3; done;;
variants) ours scripts/instep_variants.py /tmp/var   # the in-step attention's zero-line variants inside the engine, 1B prefill step
    prof() { PYTHONPATH=$SITE python3 $1/scripts/profile_decode.py --config llama-3.2-1b --device CUDA --batch 1 --ctx 1024 --prefill \
      --kv-cache-memory 4 --enforce-eager --top 8 "${@:2}" 2>&1 | grep -A11 "^## prefill"; }
    echo "== today"; prof .; for v in p16 s16 both; do echo "== $v"; prof /tmp/var/$v; done
    echo "== today, the step BEAM-searched"; prof . --step-beam 2;;
lat1b) for who in ours base; do echo "== $who 1B"; $who scripts/bench.py --config llama-3.2-1b --device CUDA --latency 2>&1 | grep -E "SUMMARY"; done;;
health) for who in base ours base ours; do echo "== $who"   # /health of a fresh server (an empty cache.db each), in turns
    CACHEDB=/tmp/health-$who-$RANDOM.db $who scripts/bench_serving.py --launch --config llama-3.2-1b --device CUDA --health-only 2>&1 | grep -E "healthy after|loaded|KV cache|ready after|ready on"; done;;
healthsampled) for who in ours base; do tree=$PWD; [ $who = base ] && tree=$PWD/$BASE; echo "== $who, sampled"
    CACHEDB=/tmp/hs-$who.db PYTHONPATH=$SITE:$PWD/scripts/stack_sampler:$tree python3 $tree/scripts/bench_serving.py --launch --config llama-3.2-1b \
      --device CUDA --health-only 2>&1 | grep -E "healthy after|ready after|ready on"; mkdir -p $OUT/$who; mv $OUT/stacks-*.txt $OUT/$who/; done;;
clmin) mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd; export OCL_ICD_VENDORS=/tmp/icd   # the shortest CL check
    for dev in CUDA CL; do ours scripts/check_backends.py --device $dev 2>&1 | grep -E '^\{|Error' | tail -2; done
    for dev in CUDA CL; do ours scripts/check_backends.py --device $dev --config llama-3.2-1b --dtype float16 --tokens 24 --enforce-eager 2>&1 | grep -E '^\{|Error' | tail -2; done
    echo "== ours 1B float16 on CL"; DEV=CL ours scripts/bench.py --config llama-3.2-1b --device CL --dtype float16 --latency --copy-gib 0.25 2>&1 | grep -E "SUMMARY|Error" | tail -3;;
esac; done
