#!/usr/bin/env bash
# sweep_cmd_ci.sh ROOT [INTERPOSER]: bench/sweep --cmd, the sweep of any trainer (docs/SWEEP.md).
#  1. The DDP example (gcomp's hook, stats written by the Python binding), 2 ranks, codecs none
#     and terngrad, a quarter epoch of --quick (25 steps): results.csv has the header and 2
#     rows with learned accuracies and the bytes of the stats files, the plots are written.
#  2. With INTERPOSER (libgcomp_mpi.so): an unmodified mpi4py program under LD_PRELOAD, its
#     stats written by the interposer: the wire bytes per step are what fp16 must send.
#  3. A command without a GCOMP_RESULT line fails its point (exit 1, FAILED in results.md), so
#     does one whose figures are not finite numbers in their range (NaN, 1e999, 2.5 steps...);
#     --netem with a command that does not start with {mpirun} is a usage error (exit 2).
# Runs with /usr/bin/python3 (torch, mpi4py); PYTHONPATH and GCOMP_LIBRARY come from ctest.
set -euo pipefail
root=$1; interposer=${2:-}
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
sweep=("/usr/bin/python3" "$root/bench/sweep" --ranks 2 --timeout 240)

"${sweep[@]}" --codec none --codec terngrad --out "$out/ddp" \
  --cmd "{mpirun} /usr/bin/python3 $root/examples/ddp_fashion_mnist.py --sweep-point --quick --epochs 0.25"
header='spec,ef,ranks,epochs,test_acc,loss,wire_bytes_per_step,raw_bytes_per_step,cr,step_time_s,comm_share'
[ "$(head -1 "$out/ddp/results.csv")" = "$header" ] || { echo "results.csv header is wrong"; exit 1; }
for f in results.md accuracy_vs_bytes.png accuracy_vs_bytes.svg; do
  [ -s "$out/ddp/$f" ] || { echo "$f is missing or empty"; exit 1; }
done
/usr/bin/python3 - "$out/ddp" <<'PY'
import csv, glob, json, sys
d = sys.argv[1]
rows = {r["spec"]: r for r in csv.DictReader(open(d + "/results.csv"))}
if sorted(rows) != ["none", "terngrad"]:
    sys.exit("results.csv rows: %s, expected none and terngrad" % sorted(rows))
for spec, r in rows.items():
    acc, wire = float(r["test_acc"]), float(r["wire_bytes_per_step"])
    print("%s: test accuracy %.2f %%, %.0f wire B/step, cr %s, epochs %s" % (spec, acc, wire, r["cr"], r["epochs"]))
    if not 40.0 <= acc <= 100.0:
        sys.exit("%s: accuracy %.2f %% is not well above chance (10 %%)" % (spec, acc))
    if r["epochs"] != "0.25":
        sys.exit("%s: epochs %r, the example reported 0.25" % (spec, r["epochs"]))
    # the sweep's figure is the ranks' stats files over the reported steps
    stats = sorted(glob.glob(d + "/points/*_%s_ef1_r2.stats.*.json" % spec))
    res = json.load(open(glob.glob(d + "/points/*_%s_ef1_r2.json" % spec)[0]))["result"]
    if len(stats) != 2:
        sys.exit("%s: %d stats files, expected one per rank" % (spec, len(stats)))
    want = sum(json.load(open(p))["wire_bytes"] for p in stats) / 2 / res["steps"]
    if abs(wire - want) > 1:
        sys.exit("%s: wire B/step %.0f, the stats files say %.1f" % (spec, wire, want))
# 235,146 float32 parameters, 2 ranks: an uncompressed ring sends 4 x 235146 bytes per step
if not 0.99 <= float(rows["none"]["cr"]) <= 1.01 or \
        abs(float(rows["none"]["raw_bytes_per_step"]) - 4 * 235146) > 1:
    sys.exit("none: raw %s B/step, cr %s: expected 940584 and 1" % (rows["none"]["raw_bytes_per_step"],
                                                                   rows["none"]["cr"]))
if float(rows["terngrad"]["wire_bytes_per_step"]) * 8 > float(rows["none"]["wire_bytes_per_step"]):
    sys.exit("terngrad sends more than 1/8 of none's bytes")
PY

if [ -n "$interposer" ]; then
  # A stand-in trainer: plain mpi4py, three float32 sums of 100,000 elements per "step".
  cat >"$out/prog.py" <<'PY'
import json, numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD
x, y = np.ones(100000, np.float32), np.empty(100000, np.float32)
for step in range(3):
    c.Allreduce(x, y, op=MPI.SUM)
if c.rank == 0:
    print("GCOMP_RESULT " + json.dumps({"test_acc": float(y[0]) * 10, "steps": 3}))
PY
  # (a sanitizer build preloads the ASan runtime first, as interpose.sh does)
  pre=$(ldd "$interposer" | awk '/libasan/ {print $3 ":"}')
  "${sweep[@]}" --codec fp16 --out "$out/ip" --cmd "{mpirun} -x LD_PRELOAD=$pre$interposer /usr/bin/python3 $out/prog.py"
  /usr/bin/python3 - "$out/ip/results.csv" <<'PY'
import csv, sys
r = next(csv.DictReader(open(sys.argv[1])))
print("interposer, fp16: acc %s, wire %s B/step, raw %s, cr %s" % (r["test_acc"], r["wire_bytes_per_step"],
                                                                 r["raw_bytes_per_step"], r["cr"]))
# 2 ranks: a ring sends 2(N-1)/N x 400,000 bytes = 400,000 per call uncompressed; fp16 half
if float(r["test_acc"]) != 20.0 or float(r["raw_bytes_per_step"]) != 400000.0 or \
        not 195000 <= float(r["wire_bytes_per_step"]) <= 205000:
    sys.exit("interposer sweep: expected acc 20, raw 400000 and about 200000 wire bytes per step")
PY
fi

rc=0
"${sweep[@]}" --codec none --out "$out/bad" --cmd "{mpirun} true" || rc=$?
[ "$rc" -eq 1 ] && grep -q "FAILED: \`none\`" "$out/bad/results.md" ||
  { echo "a command without GCOMP_RESULT should fail its point (exit 1), got $rc"; exit 1; }
# A figure that Python's json reads but that is no number of its range (NaN, Infinity, 1e999,
# a fraction of a step, true) fails its point, naming the field; a NaN loss (a run that
# diverged) is noted as no loss, as bench/train's null. A stand-in command, no gcomp: fast.
cat >"$out/figures.sh" <<'SH'
#!/bin/sh
for r in 0 1; do
  echo '{"wire_bytes": 1000, "raw_bytes": 2000, "baseline_bytes": 2000}' >"$(echo "$GCOMP_STATS_FILE" | sed "s/%r/$r/")"
done
case $1 in
acc_nan) echo 'GCOMP_RESULT {"test_acc": NaN, "steps": 10}' ;;
acc_inf) echo 'GCOMP_RESULT {"test_acc": 1e999, "steps": 10}' ;;
acc_range) echo 'GCOMP_RESULT {"test_acc": 100.5, "steps": 10}' ;;
steps_inf) echo 'GCOMP_RESULT {"test_acc": 80, "steps": Infinity}' ;;
steps_frac) echo 'GCOMP_RESULT {"test_acc": 80, "steps": 2.5}' ;;
steps_bool) echo 'GCOMP_RESULT {"test_acc": 80, "steps": true}' ;;
time_nan) echo 'GCOMP_RESULT {"test_acc": 80, "steps": 10, "train_time_s": NaN}' ;;
train_steps_0) echo 'GCOMP_RESULT {"test_acc": 80, "steps": 10, "train_time_s": 1, "train_steps": 0}' ;;
loss_nan) echo 'GCOMP_RESULT {"test_acc": 80, "steps": 10, "loss": NaN, "train_time_s": 1}' ;;
ok) echo 'GCOMP_RESULT {"test_acc": 80, "steps": 10}' ;;
esac
SH
cases=(acc_nan acc_inf acc_range steps_inf steps_frac steps_bool time_nan train_steps_0 loss_nan)
rc=0
"${sweep[@]}" "${cases[@]/#/--codec=}" --out "$out/fig" --cmd "sh $out/figures.sh {codec}" >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 1 ] || { echo "points with non-finite or out-of-range figures should fail (exit 1), got $rc"; exit 1; }
i=0
for want in "test_acc is NaN" "test_acc is Infinity" "test_acc is 100.5" "steps is Infinity" "steps is 2.5" \
  "steps is true" "train_time_s is NaN" "train_steps is 0"; do
  i=$((i + 1))
  grep -q "FAILED: \`${cases[i - 1]}\`" "$out/fig/results.md" &&
    grep -qF "GCOMP_RESULT $want: must be" "$out/fig/points/0${i}_${cases[i - 1]}_ef1_r2.log" ||
    { echo "${cases[i - 1]}: the point should fail with 'GCOMP_RESULT $want'"; exit 1; }
done
[ "$(cut -d, -f1,5,6,10 "$out/fig/results.csv" | tail -n +2)" = "loss_nan,80.00,,0.100000" ] &&
  grep -q "loss NaN (reported as no loss" "$out/fig/results.md" ||
  { echo "loss_nan: expected a row without a loss and a note"; cat "$out/fig/results.csv"; exit 1; }
# the commands reported no epochs: the plot's title names none (was "...,  epochs, 2 ranks")
if command -v gnuplot >/dev/null; then
  grep '^set title ' "$out/fig/accuracy_vs_bytes.png.gp" | grep -v epochs | grep -q '{codec}, 2 ranks" noenhanced$' ||
    { echo "the plot's title should end '{codec}, 2 ranks'"; grep "set title" "$out/fig/accuracy_vs_bytes.png.gp"; exit 1; }
fi
echo "non-finite figures: $i points failed, naming the field; a NaN loss noted"
# an output folder whose name holds glob's characters: the ranks' stats files are still found
# (every point failed, "no stats file"); one holding %r is refused (gcomp would replace it).
# Its command is long: the plot's title is wrapped and cut, not clipped at the picture's edges.
long=$(printf ' --unused-argument-%d' {1..40})
"${sweep[@]}" --codec ok --out "$out/g[1]*" --cmd "sh $out/figures.sh {codec}$long" >/dev/null
[ "$(cut -d, -f1,5,7 "$out/g[1]*/results.csv" | tail -n +2)" = "ok,80.00,100" ] ||
  { echo "--out with [ ] *: expected the point's row"; cat "$out/g[1]*/results.csv"; exit 1; }
if command -v gnuplot >/dev/null; then
  /usr/bin/python3 - "$out/g[1]*/accuracy_vs_bytes.png.gp" <<'PY' || exit 1
import sys
title = [l for l in open(sys.argv[1]) if l.startswith("set title ")][0]
parts = title[len('set title "'):title.rindex('"')].split("\\n")
if len(parts) > 3 or max(map(len, parts)) > 100 or "..." not in title or not title.endswith(', 2 ranks" noenhanced\n'):
    sys.exit("a long --cmd: the plot's title should be at most 3 lines of at most 100 characters, "
             "the command cut with '...', ending ', 2 ranks': %r" % title)
PY
fi
rc=0
"${sweep[@]}" --codec ok --out "$out/run%r" --cmd "sh $out/figures.sh {codec}" 2>/dev/null || rc=$?
[ "$rc" -eq 2 ] || { echo "--out holding %r with --cmd should exit 2, got $rc"; exit 1; }
rc=0
"${sweep[@]}" --codec none --netem 1gbit --out "$out/bad2" --cmd "mpirun -np 2 true" 2>/dev/null || rc=$?
[ "$rc" -eq 2 ] || { echo "--netem with a command not starting with {mpirun} should exit 2, got $rc"; exit 1; }
echo "sweep_cmd_ci: ok"
