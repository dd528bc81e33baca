#!/bin/bash
# allreduce_perf's check can fail: with tests/bench_fault.c preloaded, gcomp_allreduce's
# result is broken the ways a defect could break it, and every row must count wrong
# elements and the run must exit 1. (Before, an all-zero, halved or negated result passed
# TernGrad's and top-k's error bounds: #wrong 0.)
# usage: bench_check_fails.sh MPIEXEC ALLREDUCE_PERF BENCH_FAULT_SO
set -u
mpiexec=$1 perf=$2 shim=$3
# (clip=1e+0: a "+" inside a number, which the check must read as the library does)
codecs=(none fp16 terngrad terngrad:clip=0,bucket=512 terngrad:clip=1e+0,bucket=512 topk:ratio=0.01
    topk:k=40,values=fp16)
args=()
for c in "${codecs[@]}"; do args+=(--codec "$c"); done
bad=0
for fault in skip zero half negate local; do
    out=$(timeout 120 "$mpiexec" --oversubscribe -np 3 -x LD_PRELOAD="$shim" -x GCOMP_TEST_FAULT=$fault \
        "$perf" -b 64K -e 64K -n 1 -w 0 "${args[@]}" 2>&1)
    rc=$?
    # a row: size count type redop root time algbw busbw #wrong ... sched
    rows=$(awk '/^ *[0-9]/ { print $9 }' <<<"$out")
    caught=$(awk '$1 > 0' <<<"$rows" | wc -l)
    echo "fault $fault: exit $rc, rows with wrong elements: $caught of ${#codecs[@]} (#wrong:" $rows ")"
    if [ "$rc" != 1 ] || [ "$caught" != ${#codecs[@]} ]; then
        echo "$out"
        bad=1
    fi
done
# and without a fault, the same rows pass
out=$(timeout 120 "$mpiexec" --oversubscribe -np 3 "$perf" -b 64K -e 64K -n 1 -w 0 "${args[@]}" 2>&1) ||
    { echo "$out"; echo "FAIL: the run without a fault failed"; exit 1; }
[ $bad = 0 ] || { echo "FAIL: a broken result passed the check"; exit 1; }
echo "ok"
