#!/usr/bin/env bash
# sweep_args_ci.sh ROOT TRAINER: bench/sweep refuses what it cannot run with a usage error
# (exit 2 and a message, no traceback), copes with points that put no bytes on the wire, and
# leaves in --out only the files of its last run. The figures come from a stand-in --cmd
# trainer (a shell script), so no case trains; the whole script takes a few seconds.
set -uo pipefail
root=$(realpath "$1"); trainer=$(realpath "$2")
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
cd "$out" || exit 1 # what a regression writes into the current directory (--out "") stays here
sweep=(/usr/bin/python3 "$root/bench/sweep" --trainer "$trainer")
fails=0

# expect_usage TEXT ARGS...: bench/sweep ARGS exits 2 and its stderr contains TEXT, no traceback.
expect_usage() {
  local text=$1 rc=0
  shift
  timeout 120 "${sweep[@]}" "$@" >"$out/stdout" 2>"$out/stderr" || rc=$?
  if [ "$rc" -eq 2 ] && grep -qF -- "$text" "$out/stderr" && ! grep -q Traceback "$out/stderr"; then
    echo "ok: $*: exit 2, $(grep -F -- "$text" "$out/stderr" | head -1)"
  else
    echo "FAIL: $*: exit $rc, expected 2 and '$text'; stderr:"
    sed 's/^/    /' "$out/stderr" | tail -5
    fails=$((fails + 1))
  fi
}

touch "$out/afile"
expect_usage "--ranks values must be >= 2" --ranks 1 --codec none --out "$out/r1"
expect_usage "--ranks values must be >= 2" --ranks 2,1 --codec none --out "$out/r1"
expect_usage "--out /proc/e2" --ranks 2 --codec none --out /proc/e2
expect_usage "--out $out/afile/sub" --ranks 2 --codec none --out "$out/afile/sub"
expect_usage "--epochs must be a positive number" --ranks 2 --codec none --epochs nan --out "$out/e"
expect_usage "--epochs must be a positive number" --ranks 2 --codec none --epochs inf --out "$out/e"
# what the trainer's strtod or its seed range refuses is a usage error here, not failed points
expect_usage "--epochs must be a positive number" --ranks 2 --codec none --epochs "0.05 " --out "$out/e"
expect_usage "--epochs must be a positive number" --ranks 2 --codec none --epochs 0_05 --out "$out/e"
expect_usage "--seed values must be distinct and in [0, 2^63)" --ranks 2 --codec none --seed 9223372036854775808 --out "$out/e"
# a spec the library refuses is refused before the first point (not a failed point per spec),
# where the sweep can ask the trainer's library (not a sanitizer build's: it says so and goes on)
probe=$(timeout 120 "${sweep[@]}" --ranks 2 --codec bogus --out "$out/probe" 2>&1)
if grep -q "codec specs not checked up front" <<<"$probe"; then
  echo "skip: the spec checks (the sweep cannot load this trainer's library)"
else
  expect_usage "--codec bogus: GCOMP_ERR_INVALID_SPEC: unknown codec 'bogus'" --ranks 2 --codec none --codec bogus --out "$out/e"
  expect_usage "ratio=2 is out of range" --ranks 2 --codec topk:ratio=2 --out "$out/e"
  expect_usage "clip='x' is not a number" --ranks 2 --codec terngrad:clip=x --cmd 'true' --out "$out/e"
  expect_usage "--codec : spec is an empty codec spec" --ranks 2 --codec '' --out "$out/e"
  expect_usage "unknown codec 'fp16|'" --ranks 2 --codec 'fp16|' --cmd 'true' --out "$out/e"
fi
# what argparse's float() takes and strtod does not, and a rate bench/netem.sh would refuse at
# every point; a launcher behind --netem's {mpirun} (its processes would escape the links)
expect_usage "--timeout must be a positive number of seconds, got '1_0'" --ranks 2 --codec none --timeout 1_0 --out "$out/e"
expect_usage "--timeout must be a positive number of seconds, got '$(printf '\u0661')'" --ranks 2 --codec none --timeout "$(printf '\u0661')" --out "$out/e"
expect_usage "--netem RATE must be none or a tc rate like 1gbit" --ranks 2 --codec none --netem 1gigabit --out "$out/e"
expect_usage "would start a launcher on every emulated host" --ranks 2 --codec none --netem 1gbit \
  --cmd '{mpirun} /usr/bin/torchrun x.py' --out "$out/e"
expect_usage "'{mpirun} python3 -m torch.distributed.run ...' would start a launcher" --ranks 2 --codec none \
  --netem 1gbit --cmd '{mpirun} env A=1 python3 -m torch.distributed.run x.py' --out "$out/e"
expect_usage "'{mpirun} mpirun.openmpi ...' would start a launcher" --ranks 2 --codec none --netem 1gbit \
  --cmd '{mpirun} mpirun.openmpi x' --out "$out/e"
# a setting twice would run twice and be averaged as if seeds
expect_usage "--codec values must be distinct" --ranks 2 --codec none --codec none --out "$out/e"
expect_usage "--ef values must be distinct" --ranks 2 --codec none --ef 1,1 --out "$out/e"
# argparse's own refusals are one line too (was: the usage block, then the error)
rc=0
timeout 60 "${sweep[@]}" --ranks a --out "$out/e" >"$out/stdout" 2>"$out/stderr" || rc=$?
if [ "$rc" -ne 2 ] || [ "$(wc -l <"$out/stderr")" -ne 1 ]; then
  echo "FAIL: --ranks a: exit $rc, $(wc -l <"$out/stderr") lines on stderr (want 2 and one line)"
  fails=$((fails + 1))
else
  echo "ok: --ranks a: $(cat "$out/stderr")"
fi
# a flag given twice is refused, not settled by the last one
expect_usage "--ef is given twice (give one comma list, e.g. --ef 0,1)" --ranks 2 --codec none --epochs 0.02 --ef 0 --ef 1 --out "$out/e"
expect_usage "--epochs is given twice" --ranks 2 --codec none --epochs 0.02 --epochs 0.05 --out "$out/e"
expect_usage "--out is given twice" --ranks 2 --codec none --epochs 0.02 --out "$out/e" --out "$out/f"
# an empty --out was the current directory, whose results.* the sweep then replaced
expect_usage "--out is empty" --ranks 2 --codec none --epochs 0.02 --out ""
# an output name taken by a directory was found only after every point had run (a traceback)
mkdir -p "$out/inway/results.md"
expect_usage "inway/results.md is in the way of the sweep's output of that name" --ranks 2 --codec none --epochs 0.02 --out "$out/inway"
# the sweep's own settings after --: the trainer would get them twice (and refuse them at every point)
expect_usage "--epochs after -- would override" --ranks 2 --codec none --out "$out/e" -- --epochs 0.2
expect_usage "--model, --seed after -- would override" --ranks 2 --codec none --out "$out/e" -- --seed=3 --model cnn
# and their abbreviations, which the trainer's getopt_long takes (--ep: --epochs)
expect_usage "--epochs after -- would override" --ranks 2 --codec none --out "$out/e" -- --ep 0.2
expect_usage "--json after -- would override the sweep's own setting: the sweep writes each point's JSON itself" \
  --ranks 2 --codec none --out "$out/e" -- --json x.json
# lists and integers: ASCII digits only, no empty item (Python's int() takes '1_0' and U+FF12)
fw2=$(printf '\357\274\222') # U+FF12, FULLWIDTH DIGIT TWO, in UTF-8
expect_usage "argument --ranks: '2,' has an empty item" --ranks 2, --codec none --out "$out/e"
expect_usage "argument --ef: '0,,1' has an empty item" --ranks 2 --ef 0,,1 --codec none --out "$out/e"
expect_usage "argument --ef: empty list" --ranks 2 --ef '' --codec none --out "$out/e"
expect_usage "argument --ranks: '1_0' is not a comma-separated list of integers" --ranks 1_0 --codec none --out "$out/e"
expect_usage "argument --ranks: '$fw2' is not a comma-separated list" --ranks "$fw2" --codec none --out "$out/e"
expect_usage "argument --evals-per-epoch: '1_0' is not an integer" --ranks 2 --evals-per-epoch 1_0 --codec none \
  --out "$out/e"
expect_usage "argument --evals-per-epoch: '$fw2' is not an integer" --ranks 2 --evals-per-epoch "$fw2" --codec none \
  --out "$out/e"
expect_usage "--evals-per-epoch must be >= 1" --ranks 2 --codec none --evals-per-epoch 0 --out "$out/e"
expect_usage "--timeout must be a positive number" --ranks 2 --codec none --timeout 0 --out "$out/e"
expect_usage "--timeout must be a positive number" --ranks 2 --codec none --timeout -5 --out "$out/e"
expect_usage "--timeout must be a positive number" --ranks 2 --codec none --timeout nan --out "$out/e"

# A stand-in trainer: one stats file per rank and a GCOMP_RESULT line; the `none` point puts
# no bytes on the wire (as one rank would), fp16 500 per step.
cat >"$out/fake.sh" <<'SH'
#!/bin/sh
w=0; [ "$1" = none ] || w=1000
r=0
while [ "$r" -lt "$2" ]; do
  f=$(echo "$GCOMP_STATS_FILE" | sed "s/%r/$r/")
  echo "{\"wire_bytes\": $w, \"raw_bytes\": 2000, \"baseline_bytes\": $w}" >"$f"
  r=$((r + 1))
done
echo 'GCOMP_RESULT {"test_acc": 80.5, "steps": 2}'
SH
cmd="sh $out/fake.sh {codec} {ranks}"

# A point without wire bytes: cr and "x fewer" are n/a, the plot shows the others.
rc=0
timeout 120 "${sweep[@]}" --ranks 2 --codec none --codec fp16 --seed 1,2 --out "$out/zw" --cmd "$cmd" \
  >"$out/stdout" 2>"$out/stderr" || rc=$?
if [ "$rc" -ne 0 ] || grep -q Traceback "$out/stderr" || ! grep -q '| `none` .*| n/a |' "$out/zw/results.md" ||
  [ "$(grep -c '^none,\|^fp16,' "$out/zw/results.csv")" -ne 2 ]; then
  echo "FAIL: a point with no wire bytes: exit $rc"; tail -5 "$out/stderr"; cat "$out/zw/results.md" 2>/dev/null
  fails=$((fails + 1))
else
  echo "ok: a point with no wire bytes: $(grep '^| `none`' "$out/zw/results.md")"
fi
if command -v gnuplot >/dev/null && [ ! -s "$out/zw/accuracy_vs_bytes.png" ]; then
  echo "FAIL: no plot of the points with wire bytes"; fails=$((fails + 1))
fi

# The same directory again, one seed and only the point without bytes (so no plot): nothing of
# the first run may remain, and files the sweep did not write stay.
first=(results_by_seed.csv points/02_none_ef1_r2_s2.json points/03_fp16_ef1_r2_s1.log
  points/04_fp16_ef1_r2_s2.stats.1.json)
command -v gnuplot >/dev/null && first+=(accuracy_vs_bytes.png accuracy_vs_bytes.svg accuracy_vs_bytes.dat
  accuracy_vs_bytes.png.gp accuracy_vs_bytes.svg.gp)
for f in "${first[@]}"; do # (else the check below could not fail)
  [ -e "$out/zw/$f" ] || { echo "FAIL: the first run did not write $f"; fails=$((fails + 1)); }
done
touch "$out/zw/mine.txt" "$out/zw/points/mine.json"
rc=0
# (--epochs 0 and --evals-per-epoch 0 do not apply to a command: not refused)
timeout 120 "${sweep[@]}" --ranks 2 --codec none --out "$out/zw" --cmd "$cmd" --epochs 0 --evals-per-epoch 0 \
  >"$out/stdout" 2>"$out/stderr" || rc=$?
stale=""
for f in "${first[@]}"; do
  [ -e "$out/zw/$f" ] && stale="$stale $f"
done
if [ "$rc" -ne 0 ] || [ -n "$stale" ] || [ ! -e "$out/zw/mine.txt" ] || [ ! -e "$out/zw/points/mine.json" ] ||
  [ "$(tail -n +2 "$out/zw/results.csv" | wc -l)" -ne 1 ]; then
  echo "FAIL: re-used --out (with --cmd, --epochs 0 --evals-per-epoch 0 taken): exit $rc, left from the first run:${stale:- nothing}; mine.txt kept:" \
    "$([ -e "$out/zw/mine.txt" ] && [ -e "$out/zw/points/mine.json" ] && echo yes || echo no)"
  tail -5 "$out/stderr"
  fails=$((fails + 1))
else
  echo "ok: re-used --out: the first run's outputs removed, other files kept"
fi

# A backquote in the plot's title is text: gnuplot runs `...` in a command line, strings too.
if command -v gnuplot >/dev/null; then
  rc=0
  timeout 120 "${sweep[@]}" --ranks 2 --codec fp16 --out "$out/bq" --cmd "$cmd" \
    --title "net \`touch $out/bq_ran\` \`" >"$out/stdout" 2>"$out/stderr" || rc=$?
  if [ "$rc" -ne 0 ] || [ -e "$out/bq_ran" ] || ! grep -qF 'set title "net \140touch' "$out/bq/accuracy_vs_bytes.png.gp"; then
    echo "FAIL: a backquoted --title: exit $rc, its command ran: $([ -e "$out/bq_ran" ] && echo yes || echo no)"
    grep 'set title' "$out/bq/accuracy_vs_bytes.png.gp" 2>/dev/null
    fails=$((fails + 1))
  else
    echo "ok: a backquoted --title is text: $(grep 'set title' "$out/bq/accuracy_vs_bytes.png.gp")"
  fi
fi

# TERM or Ctrl-C to the sweep stops the point in progress too (before: its mpirun and ranks ran
# on; Ctrl-C printed a traceback), and the points that ran are written with a STOPPED note.
cat >"$out/slow.sh" <<'SH'
#!/bin/sh
[ "$1" = none ] && exec sh "$3" "$1" "$2"
echo $$ >"$4"
exec sleep 60
SH
# alive: a state other than Z (a killed child of the point's shell may wait a moment to be reaped)
alive() { case "$(ps -o stat= -p "$1" 2>/dev/null)" in "" | Z*) return 1 ;; esac; }
for sig in TERM INT; do
  want=$([ $sig = TERM ] && echo 143 || echo 130)
  rm -f "$out/term.pid"
  # a background job's SIGINT is ignored; the sweep gets the default, as from a terminal
  timeout 120 /usr/bin/python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
    "${sweep[@]}" --ranks 2 --codec none --codec fp16 --out "$out/term" \
    --cmd "sh $out/slow.sh {codec} {ranks} $out/fake.sh $out/term.pid" >"$out/stdout" 2>"$out/stderr" &
  spid=$!
  for _ in $(seq 50); do [ -s "$out/term.pid" ] && break; sleep 0.2; done
  kill -$sig "$spid"
  rc=0
  wait "$spid" || rc=$?
  sleep 1
  if [ ! -s "$out/term.pid" ] || alive "$(cat "$out/term.pid")" || [ "$rc" -ne "$want" ] ||
    grep -q Traceback "$out/stderr" || [ "$(tail -n +2 "$out/term/results.csv" 2>/dev/null | wc -l)" -ne 1 ] ||
    ! grep -q "^STOPPED: .* after 1 of its 2 points" "$out/term/results.md"; then
    echo "FAIL: $sig to the sweep: exit $rc (want $want), the point's process $(cat "$out/term.pid" 2>/dev/null)" \
      "still running: $(alive "$(cat "$out/term.pid" 2>/dev/null)" && echo yes || echo no)"
    tail -5 "$out/stderr"
    kill "$(cat "$out/term.pid" 2>/dev/null)" 2>/dev/null
    fails=$((fails + 1))
  else
    echo "ok: $sig to the sweep: exit $rc, the point's process stopped, the finished point written"
  fi
done

# A closed terminal (HUP, then every write to it fails): the finished point is still written
# with its STOPPED line, exit 129 (before: the stop message's write raised, exit 1, no results).
rm -f "$out/term.pid"
rc=0
timeout 120 /usr/bin/python3 - "$out/term.pid" "${sweep[@]}" --ranks 2 --codec none --codec fp16 --out "$out/hup" \
  --cmd "sh $out/slow.sh {codec} {ranks} $out/fake.sh $out/term.pid" <<'PY' || rc=$?
import os, select, sys, time
pidfile, argv = sys.argv[1], sys.argv[2:]
master, slave = os.openpty()
pid = os.fork()
if pid == 0:  # the sweep, with the pty as its controlling terminal and its stdio
    os.setsid()
    import fcntl, termios
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    for fd in (0, 1, 2):
        os.dup2(slave, fd)
    os.execv(argv[0], argv)
os.close(slave)
for _ in range(300):  # until the second point runs, reading what the sweep prints
    if os.path.exists(pidfile) and os.path.getsize(pidfile):
        break
    while select.select([master], [], [], 0.05)[0]:
        try:
            os.read(master, 65536)
        except OSError:
            break
    time.sleep(0.05)
os.close(master)  # the terminal goes away: the kernel sends HUP
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
PY
sleep 1
if [ "$rc" -ne 129 ] || [ "$(tail -n +2 "$out/hup/results.csv" 2>/dev/null | wc -l)" -ne 1 ] ||
  ! grep -q "^STOPPED: .* after 1 of its 2 points" "$out/hup/results.md" 2>/dev/null; then
  echo "FAIL: a closed terminal: exit $rc (want 129), results.md: $([ -e "$out/hup/results.md" ] && echo yes || echo no)"
  kill "$(cat "$out/term.pid" 2>/dev/null)" 2>/dev/null
  fails=$((fails + 1))
else
  echo "ok: a closed terminal (HUP): exit 129, the finished point written"
fi

# Ctrl-C outside the points (before: a KeyboardInterrupt traceback). While plotting (a
# stand-in gnuplot that hangs): the results are written, no plot, exit 130. In the codec check
# before the first point (its child Python held in opening GCOMP_LIBRARY, a FIFO): exit 130 and
# DIR as it was.
mkdir -p "$out/bin" "$out/pre"
printf '#!/bin/sh\necho $$ >"%s/plot.pid"\nexec sleep 60\n' "$out" >"$out/bin/gnuplot"
chmod +x "$out/bin/gnuplot"
mkfifo "$out/lib.fifo"
echo old >"$out/pre/results.md"
for phase in plot check; do
  rm -f "$out/plot.pid"
  if [ $phase = plot ]; then
    env_set=(PATH="$out/bin:$PATH"); dir="$out/plot"
  else
    env_set=(GCOMP_LIBRARY="$out/lib.fifo"); dir="$out/pre"
  fi
  env "${env_set[@]}" timeout 120 /usr/bin/python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
    "${sweep[@]}" --ranks 2 --codec fp16 --out "$dir" --cmd "$cmd" >"$out/stdout" 2>"$out/stderr" &
  spid=$!
  for _ in $(seq 100); do # the plot's gnuplot, or the codec check's Python: the sweep's child
    if [ $phase = plot ]; then [ -s "$out/plot.pid" ] && break
    else pgrep -P "$(pgrep -P "$spid")" >/dev/null && break; fi
    sleep 0.2
  done
  sleep 0.5 # (the checker's Python on to its open of the FIFO)
  kill -INT "$spid"
  rc=0
  wait "$spid" || rc=$?
  if [ $phase = plot ]; then
    want_msg="stopped (SIGINT) while plotting: no plot"
    written=$([ "$(tail -n +2 "$dir/results.csv" 2>/dev/null | wc -l)" -eq 1 ] && [ ! -e "$dir/accuracy_vs_bytes.png" ] && echo yes)
  else
    want_msg="stopped (SIGINT)"
    written=$([ "$(cat "$dir/results.md")" = old ] && [ ! -e "$dir/points" ] && echo yes)
  fi
  if [ "$rc" -ne 130 ] || grep -q Traceback "$out/stderr" || ! grep -qF "$want_msg" "$out/stderr" || [ "$written" != yes ]; then
    echo "FAIL: Ctrl-C in the $phase: exit $rc (want 130), outputs as expected: ${written:-no}"
    tail -5 "$out/stderr"
    fails=$((fails + 1))
  else
    echo "ok: Ctrl-C in the $phase: exit 130, no traceback ($want_msg)"
  fi
  [ -s "$out/plot.pid" ] && kill "$(cat "$out/plot.pid")" 2>/dev/null
done

# A point past --timeout is FAILED and leaves no JSON, even one its trainer wrote before it
# was stopped (before: a complete result beside the FAILED row of results.md).
cat >"$out/late.sh" <<'SH'
#!/bin/sh
while [ $# -gt 1 ]; do [ "$1" = --json ] && printf '{"test_acc": 50}\n' >"$2"; shift; done
exec sleep 60
SH
chmod +x "$out/late.sh"
rc=0
timeout 120 /usr/bin/python3 "$root/bench/sweep" --trainer "$out/late.sh" --ranks 2 --codec none --timeout 2 \
  --out "$out/late" >"$out/stdout" 2>"$out/stderr" || rc=$?
if [ "$rc" -ne 1 ] || [ -e "$out/late/points/01_none_ef1_r2.json" ] || ! grep -q "^FAILED" "$out/late/results.md"; then
  echo "FAIL: a point past --timeout: exit $rc (want 1), its JSON left:" \
    "$([ -e "$out/late/points/01_none_ef1_r2.json" ] && echo yes || echo no)"
  tail -5 "$out/stderr"
  fails=$((fails + 1))
else
  echo "ok: a point past --timeout is FAILED and leaves no JSON"
fi

# A point stopped by TERM leaves no JSON either, though its trainer wrote one (before: the
# JSON of a point that results.md neither ran nor failed).
rc=0
timeout 120 /usr/bin/python3 "$root/bench/sweep" --trainer "$out/late.sh" --ranks 2 --codec none --codec fp16 \
  --timeout 100 --out "$out/late_term" >"$out/stdout" 2>"$out/stderr" &
spid=$!
for _ in $(seq 100); do [ -e "$out/late_term/points/01_none_ef1_r2.json" ] && break; sleep 0.2; done
sleep 0.5
kill -TERM "$spid"
wait "$spid" || rc=$?
if [ "$rc" -ne 143 ] || [ -e "$out/late_term/points/01_none_ef1_r2.json" ]; then
  echo "FAIL: a point stopped by TERM: exit $rc (want 143), its JSON left:" \
    "$([ -e "$out/late_term/points/01_none_ef1_r2.json" ] && echo yes || echo no)"
  fails=$((fails + 1))
else
  echo "ok: a point stopped by TERM leaves no JSON"
fi

# Under nohup (HUP ignored) a HUP does not stop the sweep (before: exit 129 after 0 points).
cat >"$out/nap.sh" <<'SH'
#!/bin/sh
echo $$ >"$3"
sleep 2
exec sh "$4" "$1" "$2"
SH
rm -f "$out/nap.pid"
rc=0
timeout 120 nohup "${sweep[@]}" --ranks 2 --codec none --codec fp16 --out "$out/nohup" \
  --cmd "sh $out/nap.sh {codec} {ranks} $out/nap.pid $out/fake.sh" >"$out/stdout" 2>"$out/stderr" &
spid=$!
for _ in $(seq 100); do [ -s "$out/nap.pid" ] && break; sleep 0.2; done
kill -HUP "$spid"
wait "$spid" || rc=$?
if [ "$rc" -ne 0 ] || [ "$(tail -n +2 "$out/nohup/results.csv" 2>/dev/null | wc -l)" -ne 2 ]; then
  echo "FAIL: HUP under nohup: exit $rc (want 0, both points)"; tail -3 "$out/stderr"; fails=$((fails + 1))
else
  echo "ok: HUP under nohup: the sweep ran on, both points written"
fi

[ "$fails" -eq 0 ] || { echo "sweep_args_ci: $fails failed"; exit 1; }
echo "sweep_args_ci: ok"
