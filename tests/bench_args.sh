#!/bin/bash
# The benchmarks' command lines: sizes at the edges of what they accept, and options that
# do not fit together.
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
# host buffers go over MPI only: --transport nccl was ignored without a word
expect 2 "--transport nccl needs --device cuda" "$mpiexec" -np 2 "$perf" -e 64K -n 1 -w 0 --codec none --transport nccl
# one rank sends nothing: no ratio, n/a as the JSON's null (was "nan")
expect 0 "             0      n/a  " "$mpiexec" -np 1 "$perf" -e 64K -n 1 -w 0 --codec fp16
# ranks launched with other arguments (MPMD): a usage error on rank 1 only ends every rank
# with status 2, and rank 1 says why (was: rank 0 waited for it in the first collective)
expect 2 "rank 1 refused its arguments (rank 0 did not):" "$mpiexec" -np 1 "$perf" -e 64K -n 1 -w 0 --codec none : -np 1 "$perf" -e 64K -n 0 --codec none
# ranks launched with other valid arguments (another -n): every rank exits 2 at once (was: each
# waited for the other in a call the other never made, for good)
expect 2 "the ranks were launched with different arguments" "$mpiexec" -np 1 "$perf" -e 4K -n 2 -w 0 --codec fp16 : -np 1 "$perf" -e 4K -n 3 -w 0 --codec fp16
# -h on rank 1 only: every rank exits 0 and rank 1 prints the help (was: exit 0, silent)
expect 0 "rank 1 was asked for help (-h); no rank runs:" "$mpiexec" -np 1 "$perf" -e 64K -n 1 -w 0 --codec none : -np 2 "$perf" -h
expect 0 "usage:" "$mpiexec" -np 1 "$perf" -e 64K -n 1 -w 0 --codec none : -np 1 "$perf" -h
# --min-bytes reads sizes as -b does (was: "4K" refused while -b took it)
expect 0 "min_bytes 4096," "$mpiexec" -np 2 "$perf" -e 64K -n 1 -w 0 --codec none --min-bytes 4K
expect 2 "bad value '-1' for --min-bytes" "$mpiexec" -np 2 "$perf" -e 64K --codec none --min-bytes -1
expect 2 "bad value '4X' for --min-bytes" "$mpiexec" -np 2 "$perf" -e 64K --codec none --min-bytes 4X
# --device cuda without a GPU (or without CUDA in the build): status 2 from both benchmarks,
# naming the cause (codec_perf exited 1, "a codec call failed")
if ! nvidia-smi -L >/dev/null 2>&1; then
    expect 2 "codec_perf: --device cuda: " "$codec_perf" --device cuda -s 64K -n 1 -w 0 none
    expect 2 "cuda" "$mpiexec" -np 2 "$perf" --device cuda -e 64K -n 1 -w 0 --codec none
fi
# rows that could not be written (a full disk): status 1 and a message (was: exit 0, silent)
if [ -w /dev/full ]; then
    expect 1 "cannot write /dev/full" "$codec_perf" -s 64K -n 1 -w 0 --json-out /dev/full none
    expect 1 "cannot write standard output" bash -c '"$0" -s 64K -n 1 -w 0 --json none >/dev/full' "$codec_perf"
    expect 1 "allreduce_perf: cannot write /dev/full" "$mpiexec" -np 2 "$perf" -e 64K -n 1 -w 0 --codec none -J /dev/full
fi
# an output file that cannot be opened is output not written: 1, as the help says (was 2)
expect 1 "--json-out /nonexistent/x.json: No such file" "$codec_perf" -s 64K -n 1 -w 0 --json-out /nonexistent/x.json none
expect 1 "allreduce_perf: cannot write /nonexistent/x: No such file" "$mpiexec" -np 2 "$perf" -e 64K -n 1 -w 0 --codec none -J /nonexistent/x
# the help itself lost (was: exit 0, silent)
if [ -w /dev/full ]; then
    expect 1 "codec_perf: cannot write standard output" bash -c '"$0" -h >/dev/full' "$codec_perf"
    expect 1 "allreduce_perf: cannot write standard output" bash -c '"$0" -h >/dev/full' "$perf"
fi
# sizes of whole elements only (was: -b 6 -e 100 -f 3 ran rows of 4, 16 and 52 bytes under a
# header saying 6 and 100)
expect 2 "-b 6 and -e 100 must be multiples of the element size (4 bytes)" "$mpiexec" -np 2 "$perf" -b 6 -e 100 -f 3 --codec none
expect 2 "-b 3 and -e 3 must be multiples of the element size (2 bytes)" "$mpiexec" -np 2 "$perf" -d half -b 3 -e 3 --codec none
expect 0 "           6             3      half" "$mpiexec" -np 2 "$perf" -d half -b 6 -e 6 -n 1 -w 0 --codec none
# a scale that takes the data beyond float (was accepted: +-inf data, rel_err nan)
expect 2 "bad value '3e+38' for --scale" "$codec_perf" -s 64K -n 1 -w 0 --scale 3e38 none
expect 0 "none" "$codec_perf" -s 64K -n 1 -w 0 --scale 1e37 none
# specs run in command-line order, positional or --codec (was: every --codec first)
out=$(timeout 60 "$codec_perf" -s 4K -n 1 -w 0 fp16 --codec bf16 none 2>&1 | awk '!/^#/ && NR > 1 {printf "%s ", $1}')
if [ "$out" != "spec fp16 bf16 none " ]; then
    echo "FAIL: codec_perf fp16 --codec bf16 none ran the specs as: $out"
    fail=1
fi
# ... or to zeros (was accepted: every codec showed rel_err 0, as if exact)
expect 2 "bad value '1e-50' for --scale: expected a scale above" "$codec_perf" -s 64K -n 1 -w 0 --scale 1e-50 fp16
expect 0 "fp16" "$codec_perf" -s 64K -n 1 -w 0 --scale 1e-44 fp16
# ... in any row: the smallest rows take a prefix of the data, whose peak is smaller (was
# accepted where only the largest row's data kept a nonzero value)
expect 2 "the smallest size's largest |value| is" "$codec_perf" -b 4 -e 64K -f 4 -n 1 -w 0 --scale 2e-46 fp16
# bench/train (built next to allreduce_perf): its integer ranges, a flag given twice, an
# --epochs of no step (was: run 1 step)
train=$(dirname "$perf")/train
if [ -x "$train" ]; then
    expect 2 "--min-bytes: 99999999999999999999 is out of range [0, 9223372036854775807]" \
        "$train" --min-bytes 99999999999999999999
    expect 2 "--codec is given twice" "$train" --codec none --codec terngrad
    expect 2 "--epochs is given twice" "$train" --epochs=1 --epochs 2
    if [ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
        expect 2 "--epochs 1e-09 is 4.68e-07 steps of 468 per epoch, which rounds to none: one step is 0.00213675" \
            "$train" --epochs 1e-9
    fi
fi
[ $fail = 0 ] && echo ok
exit $fail
