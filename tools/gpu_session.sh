#!/usr/bin/env bash
# One call on a GPU machine: the gpu-marked tests, then the benchmarks, everything logged.
#   tools/gpu_session.sh [--quick] [--tests-only | --bench-only] [chapter ...]   (default: all chapters)
# Run from the repository root. Results go to $OUT (or /tmp/studylog-out) as results.tgz + logs,
# holding <gpu>/<chapter>.json exactly as `python -m studylog bench` wrote them.
# The working tree travels without .git: pass STUDYLOG_COMMIT=<hash> so the JSON records the commit.
set -u
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/studylog-out}"
mkdir -p "$OUT"
quick=""; tests_only=0; bench_only=0; chapters=()
for arg in "$@"; do
    case "$arg" in
        --quick) quick="--quick" ;;
        --tests-only) tests_only=1 ;;
        --bench-only) bench_only=1 ;;
        *) chapters+=("$arg") ;;
    esac
done
[ ${#chapters[@]} -eq 0 ] && chapters=(all)

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

test_files=()
if [ "${chapters[0]}" = all ]; then
    test_files=(tests)
else
    for c in "${chapters[@]}"; do for f in tests/test_"$c".py tests/test_"$c"_*.py; do [ -f "$f" ] && test_files+=("$f"); done; done
fi
if [ "$bench_only" = 0 ]; then
    echo "=== gpu tests: ${test_files[*]}"
    python3 -m pytest -m gpu "${test_files[@]}" -q -p no:cacheprovider -rfE --durations=10 2>&1 | tee "$OUT/gpu_tests.log" | tail -60
fi

if [ "$tests_only" = 0 ]; then
    echo "=== bench: ${chapters[*]} $quick"
    res=/tmp/studylog-results
    rm -rf "$res"
    python3 -m studylog bench "${chapters[@]}" $quick --out "$res" 2>&1 | tee "$OUT/bench.log" | grep -v "it/s\]" | tail -40
    (cd "$res" && tar czf "$OUT/results.tgz" .)
fi
