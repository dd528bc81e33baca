#!/usr/bin/env bash
# The reduced sweep CI runs: 2 ranks, 2 codecs, a tenth of an epoch of real Fashion-MNIST
# training. Checks that the CSV, the markdown table and the plots are written, and that every
# point learned (test accuracy far above the 10 % of chance).
set -euo pipefail
root=$1; trainer=$2
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
/usr/bin/python3 "$root/bench/sweep" --ranks 2 --epochs 0.1 --codec none --codec terngrad \
  --trainer "$trainer" --out "$out"
header='spec,ef,ranks,epochs,test_acc,loss,wire_bytes_per_step,raw_bytes_per_step,cr,step_time_s,comm_share'
[ "$(head -1 "$out/results.csv")" = "$header" ] || { echo "results.csv header is wrong"; exit 1; }
[ "$(tail -n +2 "$out/results.csv" | wc -l)" -eq 2 ] || { echo "results.csv should have 2 rows"; exit 1; }
for f in results.md accuracy_vs_bytes.png accuracy_vs_bytes.svg; do
  [ -s "$out/$f" ] || { echo "$f is missing or empty"; exit 1; }
done
/usr/bin/python3 - "$out/results.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for r in rows:
    acc = float(r["test_acc"])
    print(f"{r['spec']}: test accuracy {acc:.2f} %, {float(r['cr']):.1f}x fewer wire bytes")
    if acc < 50.0:
        sys.exit(f"{r['spec']}: accuracy {acc} % is not well above chance (10 %)")
PY
echo "sweep_ci: ok"
