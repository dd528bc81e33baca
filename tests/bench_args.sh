#!/bin/bash
# The benchmarks' command lines: sizes at the edges of what they accept.
# usage: bench_args.sh MPIEXEC ALLREDUCE_PERF CODEC_PERF
set -u
mpiexec=$1 perf=$2 codec_perf=$3
fail=0
# expect STATUS TEXT CMD...: CMD exits with STATUS and prints TEXT (stdout or stderr)
expect() {
    local want=$1 text=$2 out rc
    shift 2
    out=$(timeout 120 "$@" 2>&1)
    rc=$?
    if [ "$rc" != "$want" ] || ! grep -qF -- "$text" <<<"$out"; then
        echo "FAIL: $* exited $rc (want $want) without '$text':"
        echo "$out" | tail -5
        fail=1
    fi
}
# a size whose page rounding wraps (was a 4 KiB buffer filled with 2^62 floats: SIGSEGV)
expect 1 "out of memory" "$codec_perf" -s 18446744073709551600 -n 1 none
# -e alone below the default -b: one row at -e (was "-b 67108864 is larger than -e 65536")
expect 0 "65536         16384" "$mpiexec" -np 2 "$perf" -e 64K -n 1 -w 0 --codec none
expect 0 "131072         32768" "$mpiexec" -np 2 "$perf" -b 128K -n 1 -w 0 -e 128K --codec none
# both given the wrong way round: a usage error
expect 2 "-b 131072 is larger than -e 65536" "$mpiexec" -np 2 "$perf" -b 128K -e 64K --codec none
[ $fail = 0 ] && echo ok
exit $fail
