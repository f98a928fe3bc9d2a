#!/usr/bin/env bash
# One device call for this round of chapters 5 and 6 (kept so it can be re-run): quick benchmarks of both chapters
# (ternary with BitNet's kernel from the checkout in $STUDYLOG_BITNET; multi-item with the GQA batch), then Nsight
# Compute on the final W2A8 kernels (lab/ternary/w2a8_ncu.py). Results under $OUT.
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT/res"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv
date +%T
timeout "${T_TERNARY:-260}" python3 -m studylog bench ternary --quick --out "$OUT/res" > "$OUT/ternary.log" 2>&1
echo "ternary rc $?"; date +%T; tr '\r' '\n' < "$OUT/ternary.log" | grep -v '^\s*$' | tail -25
timeout "${T_MULTI:-200}" python3 -m studylog bench multi_item --quick --out "$OUT/res" > "$OUT/multi_item.log" 2>&1
echo "multi_item rc $?"; date +%T; tr '\r' '\n' < "$OUT/multi_item.log" | grep -v '^\s*$' | tail -15
timeout "${T_NCU:-90}" ncu --clock-control none --profile-from-start off --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --csv --page details python3 lab/ternary/w2a8_ncu.py > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
echo "ncu rc $?"; date +%T; tail -3 "$OUT/ncu.err"; wc -l "$OUT/ncu.csv"
