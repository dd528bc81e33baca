#!/usr/bin/env bash
# netem_ddp.sh RATE [NP] [-- example args]
#
# Runs examples/ddp_fashion_mnist.py as if every rank sat on its own host behind a link of
# RATE (e.g. 1gbit), through bench/netem.sh (read its header: one network namespace per rank,
# tbf on both ends of each rank's veth, Open MPI over TCP on 10.77.0.0/24). Both transports
# cross the shaped links: gcomp's MPI traffic (netem.sh's TCP BTL settings) and torch's gloo
# (GLOO_SOCKET_IFNAME=gc0, rendezvous at rank 0's 10.77.0.1). Needs root and iproute2.
# RATE "none" is netem.sh's plain shared-memory run (btl self,vader, no namespaces, no root):
# gloo then rendezvouses on 127.0.0.1 over loopback.
#
#   sudo examples/netem_ddp.sh 1gbit 4 -- --epochs 1
#   examples/netem_ddp.sh none 4 -- --epochs 1
#
# Environment: PYTHON (default /usr/bin/python3), GCOMP_LIBRARY (default: the checkout's
# build/libgcomp.so), TBF_* as netem.sh.
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
RATE=$1; shift
case "${RATE,,}" in
none) GLOO_ENV="" MASTER_ARGS="" ;;  # shared memory: gloo on loopback, the script's default
*) GLOO_ENV=" GLOO_SOCKET_IFNAME=gc0" MASTER_ARGS="--master-addr 10.77.0.1 " ;;
esac
NP=4
if [ $# -gt 0 ] && [ "$1" != "--" ]; then NP=$1; shift; fi
[ $# -gt 0 ] && { [ "$1" = "--" ] || { echo "netem_ddp.sh: unexpected '$1'" >&2; exit 2; }; shift; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
LIB=${GCOMP_LIBRARY:-$ROOT/build/libgcomp.so}
[ -e "$LIB" ] || { echo "netem_ddp.sh: $LIB not found: build the library or set GCOMP_LIBRARY" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# netem.sh starts this in place of allreduce_perf, with allreduce_perf's size and codec
# arguments first: drop them, keep ours.
cat >"$TMP/rank.sh" <<EOS
#!/bin/sh
args=""
while [ \$# -gt 0 ]; do
    case "\$1" in
    -b|-e|--codec) shift 2 ;;
    --) shift; break ;;
    *) break ;;
    esac
done
export PYTHONPATH="$ROOT/python" GCOMP_LIBRARY="$LIB"$GLOO_ENV OMP_NUM_THREADS=1
exec "$PYTHON" "$ROOT/examples/ddp_fashion_mnist.py" $MASTER_ARGS"\$@"
EOS
chmod +x "$TMP/rank.sh"
# "--codec none" keeps netem.sh from adding its codec list; rank.sh drops it again.
ALLREDUCE_PERF="$TMP/rank.sh" "$ROOT/bench/netem.sh" "$RATE" "$NP" 1M -- --codec none -- "$@"
