#!/usr/bin/env bash
# horovod_netem.sh [-n NP] [-r REPEATS] [-l "LINKS"] [-s "SETTINGS"] [-o DIR] [-- trainer args]
#
# Runs examples/horovod_fashion_mnist.py, a plain Horovod trainer, unchanged: once without
# gcomp and once per codec under gcomp's MPI_Allreduce interposer (LD_PRELOAD=libgcomp_mpi.so
# GCOMP_CODEC=...), on each link, REPEATS times interleaved (repeat 1 of every link and
# setting, then repeat 2, ...), and prints a table of medians: test accuracy, wall time of
# the training loop, whether the parameters ended identical on every rank, and what the
# interposer did (rank 0's GCOMP_STATS_FILE).
#
#   sudo examples/horovod_netem.sh                      # 4 ranks, 1gbit and none, 2 repeats
#   sudo examples/horovod_netem.sh -l 1gbit -r 3 -- --epochs 1 --hidden 1024,1024
#
# LINKS: bench/netem.sh rates ("1gbit": one network namespace per rank behind a veth shaped
# by tbf to 1 Gbit/s each way, Open MPI over TCP on those links only; "none": shared memory,
# btl self,vader) [default "1gbit none"]. SETTINGS: "none" (no interposer) or a codec spec,
# optionally CODEC@EFKEY to choose the interposer's residual key for that setting
# (GCOMP_INTERPOSE_EF_KEY, docs/INTERPOSE.md) [default "none terngrad topk:ratio=0.01"].
# Needs root for the namespaces (not for "none" only), Horovod with MPI
# (scripts/horovod-deps.sh) and a built interposer.
#
# Environment: GCOMP_MPI_LIB (default: build/interpose/libgcomp_mpi.so of this checkout),
# GCOMP_INTERPOSE_EF_KEY (default here: sequence, for Horovod's fusion buffer), PYTHON
# (default /usr/bin/python3); HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME and other
# HOROVOD_* / GCOMP_* variables set by the caller reach every rank; TBF_* as bench/netem.sh.
#
# Exit status: 0 when every run succeeded, 1 when any failed (a row says failed when all its
# runs did; the count goes to stderr, the logs are in DIR), 2 for a usage error.
set -euo pipefail
usage() { sed -n '2,3p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "horovod_netem.sh: $*" >&2; exit 2; }
NP=4 REPEATS=2 LINKS="1gbit none" SETTINGS="none terngrad topk:ratio=0.01" OUT=
while [ $# -gt 0 ]; do
    case "$1" in
    -n|-r|-l|-s|-o)
        [ $# -ge 2 ] || { echo "horovod_netem.sh: $1 needs a value" >&2; usage; }
        case "$1" in
        -n) NP=$2 ;;
        -r) REPEATS=$2 ;;
        -l) LINKS=$2 ;;
        -s) SETTINGS=$2 ;;
        -o) OUT=$2 ;;
        esac
        shift 2 ;;
    --) shift; break ;;
    -h|--help) usage ;;
    *) echo "horovod_netem.sh: unexpected '$1'" >&2; usage ;;
    esac
done
# bench/netem.sh's bounds for NP, checked here so that a bad one fails before any run
if ! [[ $NP =~ ^[1-9][0-9]*$ ]] || [ "$NP" -gt 200 ]; then die "-n must be 1..200, got '$NP'"; fi
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || die "-r must be a positive integer, got '$REPEATS'"
[ -n "${LINKS// /}" ] || die "-l must name at least one link"
[ -n "${SETTINGS// /}" ] || die "-s must name at least one setting"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
LIB=${GCOMP_MPI_LIB:-$ROOT/build/interpose/libgcomp_mpi.so}
EFKEY=${GCOMP_INTERPOSE_EF_KEY:-sequence}
[ -e "$LIB" ] || { echo "horovod_netem.sh: $LIB not found: build the interposer or set GCOMP_MPI_LIB" >&2; exit 2; }
"$PYTHON" -c 'import horovod.torch as h; assert h.mpi_built()' 2>/dev/null ||
    { echo "horovod_netem.sh: Horovod with MPI not importable by $PYTHON (scripts/horovod-deps.sh)" >&2; exit 2; }
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/horovod_netem.XXXXXX)
mkdir -p "$OUT"
LIB=$(cd "$(dirname "$LIB")" && pwd)/$(basename "$LIB")
TRAINER_ARGS=("$@")

# What every rank gets, written into its start script (a rank under bench/netem.sh is started
# by an Open MPI daemon inside its namespace, so the environment is passed explicitly).
passthrough_env() {
    local v
    for v in $(compgen -e); do
        case "$v" in
        HOROVOD_*|GCOMP_*) [ "$v" = GCOMP_MPI_LIB ] || printf 'export %s=%q\n' "$v" "${!v}" ;;
        esac
    done
}

# One run: link, setting, repeat. bench/netem.sh starts rank.sh in place of allreduce_perf,
# with allreduce_perf's size and codec arguments first (dropped here, as examples/netem_ddp.sh).
run_one() {
    local link=$1 setting=$2 rep=$3 dir codec key
    dir="$OUT/$(printf '%s_%s_%s' "$link" "$setting" "$rep" | tr -c 'A-Za-z0-9_.=-' '_')"
    mkdir -p "$dir"
    codec=${setting%%@*}
    key=$EFKEY
    [[ $setting == *@* ]] && key=${setting#*@}
    {
        echo '#!/bin/sh'
        echo 'while [ $# -gt 0 ]; do case "$1" in -b|-e|--codec) shift 2 ;; --) shift; break ;; *) break ;; esac; done'
        passthrough_env
        echo "export OMP_NUM_THREADS=1"
        if [ "$codec" != none ]; then
            printf 'export LD_PRELOAD=%q GCOMP_CODEC=%q GCOMP_INTERPOSE_EF_KEY=%q GCOMP_STATS_FILE=%q\n' \
                "$LIB" "$codec" "$key" "$dir/stats_%r.json"
        fi
        printf 'exec %q %q "$@"\n' "$PYTHON" "$ROOT/examples/horovod_fashion_mnist.py"
    } >"$dir/rank.sh"
    chmod +x "$dir/rank.sh"
    echo "# $(date +%T) link $link, setting $setting, repeat $rep -> $dir/log"
    local rc=0
    ALLREDUCE_PERF="$dir/rank.sh" timeout 900 "$ROOT/bench/netem.sh" "$link" "$NP" 1K -- --codec none -- \
        "${TRAINER_ARGS[@]}" >"$dir/log" 2>&1 || rc=$?
    grep -h "^RESULT \|^test accuracy\|^parameters" "$dir/log" | sed 's/^/#   /' || true
    [ $rc -eq 0 ] || echo "#   exit status $rc (see $dir/log)"
    printf '%s\t%s\t%s\t%s\t%s\n' "$link" "$setting" "$rep" "$rc" "$dir" >>"$OUT/runs.tsv"
}

: >"$OUT/runs.tsv"
echo "# horovod_netem.sh: $NP ranks, links: $LINKS; settings: $SETTINGS; $REPEATS repeats interleaved;"
echo "# interposer $LIB (residual key $EFKEY unless CODEC@KEY); commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo ?);"
echo "# $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); trainer args: ${TRAINER_ARGS[*]-}"
for ((rep = 1; rep <= REPEATS; rep++)); do
    for link in $LINKS; do
        for setting in $SETTINGS; do run_one "$link" "$setting" "$rep"; done
    done
done
echo "# load average at the end $(cut -d' ' -f1-3 /proc/loadavg); logs in $OUT"

"$PYTHON" - "$OUT/runs.tsv" <<'EOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    link, setting, rep, rc, d = line.rstrip("\n").split("\t")
    res = None
    for l in open(d + "/log", errors="replace"):
        if l.startswith("RESULT "):
            res = json.loads(l[7:])
    try:
        st = json.load(open(d + "/stats_0.json"))
    except OSError:
        st = None
    runs.setdefault((link, setting), []).append((int(rc), res, st))
print("\n| link | setting | test acc (median; runs) | wall s (median; runs) | ms/step | identical params "
      "| rank 0: compressed calls (no EF) | bytes sent per step (of uncompressed) | residual keys |")
print("|---|---|---|---|---|---|---|---|---|")
failed = 0
for (link, setting), rs in runs.items():
    ok = [r for rc, r, _ in rs if rc == 0 and r]
    failed += len(rs) - len(ok)
    if not ok:
        print("| %s | %s | failed | | | | | | |" % (link, setting))
        continue
    acc = [r["test_acc"] for r in ok]
    wall = [r["train_time_s"] for r in ok]
    same = "yes" if all(r["identical_params"] for r in ok) and len(ok) == len(rs) else "NO"
    sts = [s for _, _, s in rs if s]
    calls = keys = sent = ""
    if sts:
        s = sts[0]
        steps = ok[0]["steps"]
        calls = "%d (%d)" % (s["calls_compressed"], s["calls_compressed_without_ef"])
        sent = "%.0f (%.1f%%)" % (s["wire_bytes"] / steps, 100.0 * s["wire_bytes"] / max(1, s["baseline_bytes"]))
        keys = "%d (%s)" % (s.get("residual_keys", -1), s.get("ef_key", "?"))
    print("| %s | %s | %.2f %% (%s) | %.1f (%s) | %.2f | %s | %s | %s | %s |" % (
        link, setting, statistics.median(acc), ", ".join("%.2f" % a for a in acc),
        statistics.median(wall), ", ".join("%.1f" % w for w in wall),
        1000 * statistics.median(wall) / ok[0]["steps"], same, calls, sent, keys))
if failed:
    print("\n%d of %d runs failed (a non-zero exit status or no RESULT line): see their logs"
          % (failed, sum(len(rs) for rs in runs.values())), file=sys.stderr)
    sys.exit(1)
EOF
