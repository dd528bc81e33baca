#!/bin/bash
# interpose.sh — run an unmodified MPI program under LD_PRELOAD=libgcomp_mpi.so and check
# its GCOMP_STATS_FILE against the calls the program says should have been compressed and
# passed through (see interpose_prog.c, interpose_mpi4py.py, interpose_f.f90).
#
#   interpose.sh NP CODEC LIB -- COMMAND...
# CODEC "none" runs without GCOMP_CODEC (the interposer loaded but off: every call passes).
# IP_DEBUG=NONE runs with GCOMP_DEBUG=NONE and checks that the interposer logs nothing.
# The command's stdout must hold "rank R expects compressed=C passed=P no_ef=E[ failed=X][ freed=F][ keys=K]"
# per rank (failed: compressed calls that returned an error; freed: gcomp communicators
# destroyed by MPI_Comm_free before MPI_Finalize; keys: residual keys given out).
set -euo pipefail
np=$1 codec=$2 lib=$3
shift 4
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# a sanitizer build's interposer needs the ASan runtime loaded first (python3, mpif90 programs)
asan=$(ldd "$lib" | awk '/libasan/ {print $3}')
# IP_DEBUG: the GCOMP_DEBUG to run with (default INFO); NONE checks that nothing is logged
debug=${IP_DEBUG:-INFO}
# IP_TOOL: a PMPI tool (interpose_pmpi_tool.c) preloaded after the interposer, which must
# still see the calls that pass through: its line per rank counts at least those the stats file does
env_args=(-x LD_PRELOAD="${asan:+$asan:}$lib${IP_TOOL:+:$IP_TOOL}" -x GCOMP_STATS_FILE="$out/stats_%r.json" -x GCOMP_DEBUG="$debug")
[ "$codec" != none ] && env_args+=(-x GCOMP_CODEC="$codec")
# the residual key mode, when the test sets one (interpose_fusion.c)
[ -n "${GCOMP_INTERPOSE_EF_KEY+set}" ] && env_args+=(-x GCOMP_INTERPOSE_EF_KEY="$GCOMP_INTERPOSE_EF_KEY")
# error feedback off, when the test sets it (every compressed call then counts without it)
[ -n "${GCOMP_EF:-}" ] && env_args+=(-x GCOMP_EF="$GCOMP_EF")
# a deadline, when the test sets one (else the interposer's default is checked below)
[ -n "${GCOMP_TIMEOUT_MS:-}" ] && env_args+=(-x GCOMP_TIMEOUT_MS="$GCOMP_TIMEOUT_MS")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
timeout 240 mpirun --oversubscribe -np "$np" "${env_args[@]}" "$@" >"$out/stdout" 2>"$out/stderr" || {
    echo "FAIL: mpirun exited with $?"; cat "$out/stdout" "$out/stderr"; exit 1; }
cat "$out/stdout"
grep "^gcomp_mpi: rank" "$out/stderr" || true
fail=0
for ((r = 0; r < np; r++)); do
    # -o: lines of different ranks may arrive interleaved in mpirun's stdout
    exp=$(grep -o "rank $r expects compressed=[0-9]* passed=[0-9]* no_ef=[0-9]*\( failed=[0-9]*\)\?\( freed=[0-9]*\)\?\( keys=[0-9]*\)\?" "$out/stdout") ||
        { echo "FAIL: rank $r printed no expectation"; fail=1; continue; }
    f="$out/stats_$r.json"
    [ -f "$f" ] || { echo "FAIL: no stats file for rank $r"; fail=1; continue; }
    got=$(/usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("compressed=%d passed=%d no_ef=%d" % (d["calls_compressed"], d["calls_passed_through"], d["calls_compressed_without_ef"]) + (" failed=%d" % d["calls_failed"] if sys.argv[4] == "1" else "") + (" freed=%d" % d["communicators_freed_before_finalize"] if sys.argv[2] == "1" else "") + (" keys=%d" % d["residual_keys"] if sys.argv[3] == "1" else ""))' "$f" "$([[ $exp == *freed=* ]] && echo 1 || echo 0)" "$([[ $exp == *keys=* ]] && echo 1 || echo 0)" "$([[ $exp == *failed=* ]] && echo 1 || echo 0)")
    # every compressed call without error feedback: no residual key was given out
    if [[ $got =~ compressed=([0-9]+)\ passed=[0-9]+\ no_ef=([0-9]+) ]] && [ "${BASH_REMATCH[1]}" = "${BASH_REMATCH[2]}" ] &&
        keys=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["residual_keys"])' "$f") &&
        [ "$keys" != 0 ]; then
        echo "FAIL: rank $r: no call had error feedback, yet the stats file counts $keys residual keys"; fail=1
    fi
    # the summary names the codec as given (it was cut at 255 characters; a spec may have 511)
    if [ "$codec" != none ] &&
        ! /usr/bin/python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["codec"] != sys.argv[2])' "$f" "$codec"; then
        echo "FAIL: rank $r: the stats file's codec is not '$codec'"; fail=1
    fi
    if [ -n "${IP_TOOL:-}" ]; then
        tool=$(grep -o "pmpi tool rank $r: allreduce=[0-9]* bcast=[0-9]* comm_free=[0-9]* finalize=1" "$out/stdout") ||
            tool=""
        passed=${got#*passed=}
        passed=$((${passed%% *} - 1)) # (interpose_prog's last one is inside MPI_Finalize, after the tool's line)
        if [[ ! $tool =~ allreduce=([0-9]+)\ bcast=[0-9]+\ comm_free=([0-9]+) ]] || [ "${BASH_REMATCH[1]}" -lt "$passed" ] ||
            [ "${BASH_REMATCH[2]}" -lt 1 ]; then
            echo "FAIL: rank $r: the PMPI tool preloaded after the interposer saw '${tool:-nothing}' (want MPI_Finalize," \
                "at least $passed MPI_Allreduce and an MPI_Comm_free)"
            fail=1
        else
            echo "rank $r: the PMPI tool after the interposer saw $tool"
        fi
    fi
    if [ "${exp#rank $r expects }" != "$got" ]; then
        echo "FAIL: rank $r: program expects ${exp#rank $r expects }, stats file says $got"; cat "$f"; fail=1
    else
        echo "rank $r stats file: $got (as expected)"
    fi
    if [ "$debug" = NONE ]; then
        # (a failed call is an error, reported whatever GCOMP_DEBUG says)
        logged=$(grep -v "^gcomp_mpi: rank $r: compressed MPI_Allreduce of [0-9]* floats failed: " "$out/stderr" |
            grep "^gcomp_mpi: rank $r: " || true)
        [ -z "$logged" ] || { echo "FAIL: GCOMP_DEBUG=NONE, yet rank $r logged: $logged"; fail=1; }
    else
        grep -q "^gcomp_mpi: rank $r: " "$out/stderr" || { echo "FAIL: no GCOMP_DEBUG summary line from rank $r"; fail=1; }
    fi
done
# the interposers' deadline: a week unless GCOMP_TIMEOUT_MS is set (gcomp's own default is
# 300 s); gcomp's INFO line of each communicator it made says which
if [ "$codec" != none ] && [ "$debug" != NONE ] && grep -q "^gcomp: rank .*, timeout " "$out/stderr"; then
    want=${GCOMP_TIMEOUT_MS:-604800000}
    if grep "^gcomp: rank .*, timeout " "$out/stderr" | grep -v ", timeout $want ms,"; then
        echo "FAIL: the gcomp communicators above do not have a $want ms deadline"; fail=1
    else
        echo "gcomp communicators: timeout $want ms (as expected)"
    fi
fi
[ $fail -eq 0 ] && echo "PASS: $np ranks, codec $codec"
exit $fail
