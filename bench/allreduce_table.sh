#!/usr/bin/env bash
# allreduce_table.sh [SIZE] [OUT.md]
#
# docs/BENCHMARKS.md's allreduce table in one command: bench/netem.sh at 1 Gbit/s, 10 Gbit/s and no
# limit (shared memory), 2 and 4 ranks, each codec against plain MPI_Allreduce in the same
# run, SIZE of fp32 (default 64M). Prints a markdown table (and writes it to OUT.md when
# given); the raw rows stay in the JSON-lines files next to it (OUT.md -> OUT.jsonl).
# Needs root and iproute2 for the emulated links (see bench/netem.sh). Takes about 5 minutes
# at 64M on a 2-core machine. Extra settings through the environment:
#   ITERS (default 5), WARMUP (default 2): timed and untimed calls per row on emulated links;
#   shared memory rows use twice as many of each (they are quick and noisier).
set -euo pipefail

SIZE=${1:-64M}
OUT=${2:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ITERS=${ITERS:-5}
WARMUP=${WARMUP:-2}
JSONL=$(mktemp /tmp/allreduce_table.XXXXXX.jsonl)
trap 'rm -f "$JSONL"' EXIT

for rate in 1gbit 10gbit none; do
    for np in 4 2; do
        n=$ITERS w=$WARMUP
        [ "$rate" = none ] && n=$((2 * ITERS)) w=$((2 * WARMUP))
        echo "# allreduce_table: rate $rate, $np ranks, $SIZE ..." >&2
        part=$(mktemp /tmp/allreduce_part.XXXXXX)
        bash "$ROOT/bench/netem.sh" "$rate" "$np" "$SIZE" -- -n "$n" -w "$w" -J "$part" >/dev/null
        # tag every row with its link and rank count
        sed "s/^{/{\"link\": \"$rate\", \"ranks\": $np, /" "$part" >>"$JSONL"
        rm -f "$part"
    done
done

table=$(python3 - "$JSONL" <<'EOF'
import json, sys
names = {"1gbit": "1 Gbit/s", "10gbit": "10 Gbit/s", "none": "none (shared memory)"}
print("| link | ranks | codec | gcomp ms | MPI_Allreduce ms | speedup | wire B/rank | cr | #wrong |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|")
for line in open(sys.argv[1]):
    r = json.loads(line)
    print("| %s | %d | %s | %.1f | %.1f | %.2f | %s | %.2f | %d |" % (
        names.get(r["link"], r["link"]), r["ranks"], r["codec"], r["time_us"] / 1e3,
        r["baseline_time_us"] / 1e3, r["speedup"], format(int(r["wire_bytes"]), ","), r["cr"], r["nwrong"]))
EOF
)
echo "$table"
if [ -n "$OUT" ]; then
    echo "$table" >"$OUT"
    cp "$JSONL" "${OUT%.md}.jsonl"
fi
