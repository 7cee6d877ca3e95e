# Sourced by the GPU drivers (bench_async.sh, bench_round.sh): the device machines have no network, so the wheels in .whl/ (tinygrad,
# llguidance, starlette, uvicorn, ...) go into $SITE; `ours` runs a script of the working tree, `base` one of the baseline tree $BASE.
unset PYTHONDONTWRITEBYTECODE; export PIP_ROOT_USER_ACTION=ignore PYTHONUNBUFFERED=1 DEV=CUDA
SITE=${SITE:-/tmp/site} BASE=${BASE:-.base} OUT=${OUT:-/tmp/out}; mkdir -p $OUT
[ -d $SITE/tinygrad ] || python3 -m pip install -q --no-index --no-deps --target $SITE .whl/*.whl || exit 1
ours() { PYTHONPATH=$SITE:$PWD python3 "$@"; }
base() { local s=$1; shift; PYTHONPATH=$SITE:$PWD/$BASE python3 $BASE/$s "$@"; }
nvidia-smi -L; git log --oneline -1 2>/dev/null
