#!/usr/bin/env bash
# The reduced sweep CI runs: 2 ranks, 2 codecs, a tenth of an epoch of real Fashion-MNIST
# training. Checks that the CSV, the markdown table and the plots are written, that every
# point learned (test accuracy far above the 10 % of chance), that the trainer used OpenBLAS
# kernels fit for the CPU, and that --seed LIST averages.
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
# The trainer ran the best OpenBLAS kernels this CPU allows: an x86 CPU with AVX2 must not be
# left on a pre-AVX2 kernel (bench/train: choose_blas_core), unless the user chose one.
/usr/bin/python3 - "$out/points" <<'PY'
import glob, json, os, sys
old = {"prescott", "core2", "penryn", "dunnington", "nehalem", "sandybridge", "atom", "katmai",
       "coppermine", "northwood", "banias", "unknown"}
flags = set()
for line in open("/proc/cpuinfo"):
    if line.startswith("flags"):
        flags = set(line.split(":", 1)[1].split())
        break
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    core = json.load(open(path))["blas_core"]
    log = open(path[:-5] + ".log").read()
    if "# BLAS: OpenBLAS, %s kernels" % core not in log:
        sys.exit("%s: the log does not name the BLAS kernels (%s)" % (path, core))
    if {"avx2", "fma"} <= flags and core.lower() in old and "OPENBLAS_CORETYPE" not in os.environ:
        sys.exit("%s: OpenBLAS ran its %s kernels on a CPU with AVX2" % (path, core))
    print("%s: OpenBLAS %s kernels" % (os.path.basename(path), core))
PY
# The trainer records how it reduced (overlapped by default) and gcomp's progress mode, in
# the JSON and in the log.
/usr/bin/python3 - "$out/points" <<'PY'
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(path))
    if d.get("allreduce") != "overlap" or d.get("progress") not in ("thread", "caller"):
        sys.exit("%s: allreduce/progress mode missing or wrong: %r %r" % (path, d.get("allreduce"), d.get("progress")))
    if "# allreduce: overlapped" not in open(path[:-5] + ".log").read():
        sys.exit("%s: the log does not say the allreduce mode" % path)
PY
# Several seeds: one aggregated row per setting (the mean), every run in results_by_seed.csv.
/usr/bin/python3 "$root/bench/sweep" --ranks 2 --epochs 0.02 --codec none --seed 1,2 \
  --trainer "$trainer" --out "$out/seeds"
/usr/bin/python3 - "$out/seeds" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1] + "/results.csv")))
runs = list(csv.DictReader(open(sys.argv[1] + "/results_by_seed.csv")))
if len(rows) != 1 or sorted(r["seed"] for r in runs) != ["1", "2"]:
    sys.exit("seeds: expected one mean row and runs for seeds 1 and 2")
accs = [float(r["test_acc"]) for r in runs]
if accs[0] == accs[1]:
    sys.exit("seeds: two seeds gave the same accuracy: is --seed reaching the trainer?")
if abs(float(rows[0]["test_acc"]) - sum(accs) / 2) > 0.006:
    sys.exit("seeds: results.csv is not the mean of the runs")
print("seeds: %s -> mean %s" % (accs, rows[0]["test_acc"]))
PY
# --momentum-correction: recorded in the JSON and the log, and the same bits whether each
# key's allreduce overlaps the backward pass or not (the velocity is formed before either).
for mode in overlap blocking; do
  extra=(--momentum-correction); [ "$mode" = blocking ] && extra+=(--blocking)
  /usr/bin/python3 "$root/bench/sweep" --ranks 2 --epochs 0.05 --codec topk:ratio=0.05 \
    --trainer "$trainer" --out "$out/mc_$mode" -- "${extra[@]}"
done
/usr/bin/python3 - "$out/mc_overlap/points" "$out/mc_blocking/points" <<'PY'
import glob, json, sys
got = []
for d in sys.argv[1:]:
    (path,) = glob.glob(d + "/*.json")
    j = json.load(open(path))
    if j.get("momentum_correction") != 1 or "momentum correction" not in open(path[:-5] + ".log").read():
        sys.exit("%s: momentum correction not recorded" % path)
    if j["test_acc"] < 50.0:
        sys.exit("%s: accuracy %s %% is not well above chance" % (path, j["test_acc"]))
    got.append((j["test_acc"], j["loss"]))
if got[0] != got[1]:
    sys.exit("momentum correction: overlapped %r and blocking %r differ" % tuple(got))
print("momentum correction: test accuracy %.2f %%, loss %.4f, overlapped = blocking" % got[0])
PY
echo "sweep_ci: ok"
