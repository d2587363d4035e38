#!/bin/bash
# On the GPU machine, in the repository root, after a first call that carried .gpu/c and ran
#   xz -dc .gpu/c/libtvm_compiler.so.xz > /tmp/lc.so
# a second call carries .gpu/w and runs
#   bash benchmarks/gpu/run.sh [LAYER ...]
# It installs TVM and alt-tvm under /tmp/site, runs tests/test_gpu.py, then benchmarks/bench_gpu.py
# on the layers given, then benchmarks/bench_gpu_models.py with the arguments in MODELS_ARGS
# when that is not empty (e.g. MODELS_ARGS=--profile; empty skips the models). Results go
# to $OUT. Settings: TESTS (test files, default tests/test_gpu.py), TEST_WORKERS (pytest-xdist
# processes, 1), TEST_S and BENCH_S (time limits in seconds; TEST_S=1 skips the tests in
# effect), TRIALS (measured trials per tuner, 32), SPLIT_K (split_k values at which the
# untuned point is also timed, e.g. "1 2 4 8 16"; none by default).
set -o pipefail
REPO=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/w/*.whl || exit 3
tar -xJf .gpu/w/tvm_py.tar.xz -C /tmp/site || exit 4
[ -f /tmp/lc.so ] && mv /tmp/lc.so /tmp/site/tvm/lib/libtvm_compiler.so
[ -f /tmp/site/tvm/lib/libtvm_compiler.so ] || { echo "no /tmp/lc.so: run the first call"; exit 5; }
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site . \
    > "$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 6; }
export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
# Outside the checkout: its alt_tvm/ folder lacks the sub-packages the install maps into it.
cd /tmp
python3 -c "import tvm, torch; from alt_tvm.target import detect_cuda
print(tvm.__version__, tvm.support.libinfo()['USE_CUDA'], tvm.cuda(0).exist, torch.__version__, torch.backends.cudnn.version())
print(detect_cuda())" 2>&1 | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee -a "$OUT/env.txt"
echo "setup $(( $(date +%s) - t0 )) s"
TEST_FILES=()
for t in ${TESTS:-tests/test_gpu.py}; do TEST_FILES+=("$REPO/$t"); done
timeout "${TEST_S:-300}" python3 -m pytest -q -p no:cacheprovider -c /dev/null --durations=5 \
    -n "${TEST_WORKERS:-1}" --rootdir "$REPO/tests" "${TEST_FILES[@]}" 2>&1 | tee "$OUT/test_gpu.log"
echo "tests done at $(( $(date +%s) - t0 )) s"
if [ $# -gt 0 ]; then
    timeout "${BENCH_S:-300}" python3 "$REPO/benchmarks/bench_gpu.py" --layers "$@" --trials "${TRIALS:-32}" \
        ${SPLIT_K:+--split-k $SPLIT_K} --json "$OUT/gpu.json" --log-dir "$OUT/logs" 2>&1 | tee "$OUT/bench.log"
fi
if [ -n "${MODELS_ARGS:-}" ]; then
    # shellcheck disable=SC2086  # MODELS_ARGS is a list of arguments
    timeout "${BENCH_S:-300}" python3 "$REPO/benchmarks/bench_gpu_models.py" $MODELS_ARGS 2>&1 | tee "$OUT/models.log"
fi
echo "all done at $(( $(date +%s) - t0 )) s"
