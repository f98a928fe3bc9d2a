#!/usr/bin/env bash
# Run a queue of GPU jobs in the background on the lent machine, so that a sweep longer than one call's limit
# still finishes: later calls only wait and collect. Jobs run one after another (never two on the GPU at once).
#   tools/gpu_queue.sh start JOB ...   JOB: a chapter name (its benchmark), quick:<chapter> (its reduced sweep,
#                                      --quick), test:<chapter> (its gpu tests) or
#                                      lab:<script under lab/> (run with --out, its files in $OUT/lab.tgz)
#   tools/gpu_queue.sh wait SECONDS    wait until the queue is done or SECONDS pass; pack what exists into $OUT
# Results: $OUT/results.tgz (<gpu>/<chapter>.json as `python -m studylog bench` wrote them) and $OUT/logs.tgz.
# Set STUDYLOG_COMMIT (the tree travels without .git) and PYTHONPATH before `start`.
set -u
Q=/tmp/studylog-queue
case "${1:-}" in
start)
    shift
    mkdir -p "$Q/logs" "$Q/res" "$Q/lab"
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    setsid nohup bash "$0" run "$@" >"$Q/queue.log" 2>&1 < /dev/null &
    echo "queue started: $*"
    ;;
run)
    shift
    for job in "$@"; do
        echo "=== $job start $(date +%T)"
        case "$job" in
            lab:*) python3 lab/"${job#lab:}" --out "$Q/lab" >"$Q/logs/$(basename "$job").log" 2>&1 ;;
            test:*) python3 -m pytest -m gpu tests/test_"${job#test:}"*.py -q -p no:cacheprovider -rfE -x \
                        >"$Q/logs/$job.log" 2>&1 ;;
            quick:*) python3 -m studylog bench "${job#quick:}" --quick --out "$Q/res/quick" \
                        >"$Q/logs/$job.log" 2>&1 ;;
            *) python3 -m studylog bench "$job" --out "$Q/res" >"$Q/logs/$job.log" 2>&1 ;;
        esac
        echo "=== $job rc $? $(date +%T)"
    done
    echo "=== queue done $(date +%T)"
    ;;
wait)
    end=$(( $(date +%s) + ${2:-60} ))
    while [ "$(date +%s)" -lt "$end" ] && ! grep -q "queue done" "$Q/queue.log" 2>/dev/null; do sleep 5; done
    OUT="${OUT:-/tmp/studylog-out}"; mkdir -p "$OUT"
    cat "$Q/queue.log"
    for f in "$Q"/logs/*.log; do echo "--- $f"; tr '\r' '\n' <"$f" | grep -v '^\s*$' | tail -4; done
    (cd "$Q/res" && tar czf "$OUT/results.tgz" .)
    (cd "$Q/logs" && tar czf "$OUT/logs.tgz" .)
    (cd "$Q/lab" && tar czf "$OUT/lab.tgz" .)
    ;;
*) echo "usage: $0 start JOB ... | wait SECONDS" >&2; exit 2 ;;
esac
