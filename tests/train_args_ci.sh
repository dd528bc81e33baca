#!/usr/bin/env bash
# train_args_ci.sh TRAINER: bench/train refuses what it cannot run, with a message and the exit
# code docs/SWEEP.md gives (2: usage error, 1: the run's result could not be written), instead
# of crashing, truncating a number or reporting success. Runs on a generated 100-image data set
# (IDX files, gzip), so no case loads Fashion-MNIST; each run takes about a second.
set -uo pipefail
trainer=$1
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
fails=0

# Data sets: ok (28x28), wide (14x56), corrupt (bytes changed inside the deflate stream),
# crc (a byte changed in stored, uncompressed gzip blocks: only the CRC at the end shows it)
# and cut (the gzip stream cut in half).
/usr/bin/python3 - "$out" <<'PY'
import gzip, os, shutil, struct, sys
d = sys.argv[1]
def idx(path, dims, data, level=9):
    hdr = struct.pack(">I", 0x0800 | len(dims)) + b"".join(struct.pack(">I", x) for x in dims)
    with gzip.open(path, "wb", compresslevel=level) as f:
        f.write(hdr + bytes(data))
def dataset(name, rows, cols, n=100, level=9):
    os.makedirs(os.path.join(d, name))
    labels = [i % 10 for i in range(n)]
    pixels = [(40 * labels[i] + 7 * (p % cols) + 3 * (p // cols)) % 256 for i in range(n) for p in range(rows * cols)]
    for prefix in ("train", "t10k"):
        idx(os.path.join(d, name, prefix + "-images-idx3-ubyte.gz"), [n, rows, cols], pixels, level)
        idx(os.path.join(d, name, prefix + "-labels-idx1-ubyte.gz"), [n], labels)
dataset("ok", 28, 28)
dataset("wide", 14, 56)
dataset("crc", 28, 28, level=0)
path = os.path.join(d, "crc", "train-images-idx3-ubyte.gz")
b = bytearray(open(path, "rb").read())
b[len(b) // 2] ^= 0x55
open(path, "wb").write(b)
for name in ("corrupt", "cut"):
    shutil.copytree(os.path.join(d, "ok"), os.path.join(d, name))
path = os.path.join(d, "corrupt", "train-images-idx3-ubyte.gz")
b = bytearray(open(path, "rb").read())
for i in range(len(b) // 2, len(b) // 2 + 8):
    b[i] ^= 0x55
open(path, "wb").write(b)
path = os.path.join(d, "cut", "train-images-idx3-ubyte.gz")
b = open(path, "rb").read()
open(path, "wb").write(b[:len(b) // 2])
PY

# expect RC TEXT NP ARGS...: `mpirun -np NP train ARGS` exits RC and its stderr contains TEXT.
# One rank runs as an MPI singleton, without mpirun, which takes a second or two to wind up a
# job that exited non-zero.
expect() {
  local want=$1 text=$2 np=$3 rc=0 launch=(timeout 60)
  shift 3
  [ "$np" -eq 1 ] || launch+=(mpirun --oversubscribe -np "$np")
  "${launch[@]}" "$trainer" --quiet "$@" >"$out/stdout" 2>"$out/stderr" || rc=$?
  if [ "$rc" -eq "$want" ] && grep -qF -- "$text" "$out/stderr"; then
    echo "ok: np $np $*: exit $rc, $(grep -F -- "$text" "$out/stderr" | head -1)"
  else
    echo "FAIL: np $np $*: exit $rc, expected $want and '$text'; stderr:"
    sed 's/^/    /' "$out/stderr" | head -20
    fails=$((fails + 1))
  fi
}
tiny=(--data "$out/ok" --batch 10 --epochs 0.1) # one step

# The tiny set trains (the cases below fail for what they test, not for the data).
rc=0
timeout 60 mpirun -np 2 "$trainer" --quiet "${tiny[@]}" --json "$out/ok.json" >"$out/stdout" 2>&1 || rc=$?
if [ "$rc" -ne 0 ] || ! grep -q '"test_acc"' "$out/ok.json"; then
  echo "FAIL: a run on the generated data set: exit $rc"; cat "$out/stdout"; fails=$((fails + 1))
fi

# 1. a global batch larger than the training set (was SIGFPE: zero steps per epoch)
expect 2 "--batch 101 is larger than the training set (100 images" 2 --data "$out/ok" --batch 101 --epochs 1
expect 2 "--batch 128 is larger than the training set (100 images" 4 --data "$out/ok"
# 3. --json: a path that cannot be opened stops the run before training; a write that fails exits 1
expect 2 "--json /nonexistent_dir/out.json: cannot write" 2 "${tiny[@]}" --json /nonexistent_dir/out.json
grep -q "# final" "$out/stdout" && { echo "FAIL: trained although --json cannot be written"; fails=$((fails + 1)); }
if [ -w /dev/full ]; then
  expect 1 "cannot write /dev/full" 2 "${tiny[@]}" --json /dev/full
fi
# a bad spec names --codec; a bad GCOMP_* variable names itself, not --codec (it did)
expect 2 "--codec 'bogus': unknown codec" 1 "${tiny[@]}" --codec bogus
GCOMP_DEBUG=bogus expect 2 "gcomp_comm_create_mpi: environment variable GCOMP_DEBUG='bogus'" 1 "${tiny[@]}"
# 4. optimiser settings out of range
expect 2 "--lr must be > 0" 1 "${tiny[@]}" --lr 0
expect 2 "--lr must be > 0" 1 "${tiny[@]}" --lr -0.1
expect 2 "--lr: 'nan' is not a number" 1 "${tiny[@]}" --lr nan
expect 2 "--momentum must be in [0, 1)" 1 "${tiny[@]}" --momentum 1
expect 2 "--momentum must be in [0, 1)" 1 "${tiny[@]}" --momentum -0.5
expect 2 "--wd must be >= 0" 1 "${tiny[@]}" --wd -1e-4
# 5. integers are integers, in range; epochs give a step count that fits
expect 2 "--ef: '0.5' is not an integer" 1 "${tiny[@]}" --ef 0.5
expect 2 "--batch: '100.9' is not an integer" 1 --data "$out/ok" --batch 100.9
expect 2 "--seed: -1 is out of range" 1 "${tiny[@]}" --seed -1
expect 2 "--seed: '1e30' is not an integer" 1 "${tiny[@]}" --seed 1e30
expect 2 "--seed: 18446744073709551615 is out of range" 1 "${tiny[@]}" --seed 18446744073709551615
expect 2 "--evals-per-epoch: '2.5' is not an integer" 1 "${tiny[@]}" --evals-per-epoch 2.5
expect 2 "--min-bytes: '4k' is not an integer" 1 "${tiny[@]}" --min-bytes 4k
expect 2 "--epochs 1e+300 is" 1 --data "$out/ok" --batch 10 --epochs 1e300
# minor: a negative --bucket-bytes other than -1
expect 2 "--bucket-bytes must be -1" 1 "${tiny[@]}" --bucket-bytes -7
# minor: the data: corruption is not truncation; 28x28 means 28 rows of 28
expect 2 "corrupt gzip data" 1 --data "$out/corrupt" --batch 10 --epochs 0.1
expect 2 "corrupt gzip data (incorrect data check)" 1 --data "$out/crc" --batch 10 --epochs 0.1
expect 2 "truncated" 1 --data "$out/cut" --batch 10 --epochs 0.1
expect 2 "images are not 28x28" 1 --data "$out/wide" --batch 10 --epochs 0.1

[ "$fails" -eq 0 ] || { echo "train_args_ci: $fails failed"; exit 1; }
echo "train_args_ci: ok"
