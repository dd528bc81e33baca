#!/usr/bin/env bash
# Fills .gpu-deps/ with the build and test libraries a GPU machine may lack (libzstd, cmocka),
# for scripts/gpu-check.sh to use when that machine has no internet and no such packages, and
# with a relocatable Open MPI 4.1 (.gpu-deps/openmpi, used through scripts/gpu-mpi-env.sh) so
# that gcomp builds with MPI there and its cuda;mpi tests run under mpirun.
# Run it HERE (a Debian/Ubuntu machine with apt and network), then carry .gpu-deps/ to the
# GPU machine with the working tree. Only apt-get download + dpkg-deb -x: nothing is installed.
# The Open MPI part expects Debian bookworm's packages (their layout is checked); its binaries
# need glibc >= 2.36, which an Ubuntu 24.04 image (2.39) has.
#
# Usage: scripts/gpu-deps.sh [DIR]   (default: .gpu-deps at the repository root)
#   GPU_DEPS_MPI=0   leave Open MPI out (libzstd and cmocka only)
# The folder is git-ignored through .git/info/exclude (this script adds the line).
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
dest=${1:-.gpu-deps}
PACKAGES=(libzstd-dev libzstd1 libcmocka-dev libcmocka0)

# ---- Open MPI (.gpu-deps/openmpi) -----------------------------------------------------------
# Debian bookworm's Open MPI 4.1 and the libraries it loads, trimmed to what C programs on one
# node need: shared memory between ranks (btl vader) and the PMIx server inside mpirun. The
# components for InfiniBand, libfabric, UCX, PSM and netlink go with those libraries (a GPU
# container has none of that hardware, and a component whose library is missing warns at every
# start), as do Fortran, C++, Java, OpenSHMEM, the developer headers and the docs.
MPI_PACKAGES=(libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libpmix2 libhwloc15
              libevent-core-2.1-7 libevent-pthreads-2.1-7 libmunge2)
# Needed by libhwloc and libopen-rte, and part of nearly every image: each goes into its own
# folder under fallback/, which gpu-mpi-env.sh puts on LD_LIBRARY_PATH only where the machine
# lacks that library, so a newer system copy is never shadowed.
MPI_FALLBACK_PACKAGES=(libudev1 zlib1g)
TRIPLET=x86_64-linux-gnu
# glibc's own libraries, always the machine's
GLIBC_SONAMES=" libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libutil.so.1 ld-linux-x86-64.so.2 "

fetch_openmpi() { # OUT
  local out=$1 tmp p
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download "${MPI_PACKAGES[@]}" "${MPI_FALLBACK_PACKAGES[@]}")
  local version; version=$(dpkg-deb -f "$tmp"/libopenmpi3_*.deb Version)
  case $version in 4.1.*) ;; *)
    echo "gpu-deps: apt offers Open MPI $version; this script knows Debian bookworm's 4.1" >&2
    return 1 ;;
  esac
  rm -rf "$out"; mkdir -p "$out/fallback"
  for p in "${MPI_PACKAGES[@]}"; do dpkg-deb -x "$tmp/${p}"_*.deb "$out"; done
  for p in "${MPI_FALLBACK_PACKAGES[@]}"; do dpkg-deb -x "$tmp/${p}"_*.deb "$out/fallback/$p"; done
  rm -rf "$tmp"
  check_openmpi_layout "$out"
  trim_openmpi "$out"
  flatten_libraries "$out"
  add_openmpi_entry_points "$out"
  check_closure "$out"
  echo "Open MPI $version" >"$out/VERSION"
  check_relocated_openmpi "$out"
  echo "gpu-deps: Open MPI $version unpacked into $out ($(du -sh "$out" | cut -f1));" \
       "use it through: . scripts/gpu-mpi-env.sh"
}

# The paths below are those of Debian's build (prefix /usr, libdir under openmpi/, an external
# PMIx in pmix2/); gpu-mpi-env.sh points Open MPI and PMIx at each of them.
check_openmpi_layout() { # OUT
  local f missing=0
  for f in usr/bin/orterun usr/bin/orted usr/bin/opal_wrapper usr/bin/ompi_info \
           usr/lib/$TRIPLET/openmpi/lib/openmpi3/mca_btl_vader.so \
           usr/lib/$TRIPLET/openmpi/lib/openmpi3/mca_pmix_ext3x.so \
           usr/lib/$TRIPLET/openmpi/include/mpi.h usr/lib/$TRIPLET/pmix2/lib/pmix \
           usr/share/openmpi/mpicc-wrapper-data.txt etc/openmpi/openmpi-mca-params.conf; do
    [ -e "$1/$f" ] || { echo "gpu-deps: $f is not where Debian bookworm puts it" >&2; missing=1; }
  done
  return $missing
}

trim_openmpi() { # OUT
  local out=$1 lib=$1/usr/lib/$TRIPLET
  local ompi=$lib/openmpi
  rm -rf "$out/usr/share/doc" "$out/usr/share/man" "$out/usr/share/lintian" "$out/usr/include" \
         "$lib/fortran" "$lib/pkgconfig" "$ompi/lib/pkgconfig" "$out"/fallback/*/usr/share
  # libraries of the other languages, OpenSHMEM, tracing, and the hardware named above
  find "$lib" "$ompi/lib" -maxdepth 1 \( -name 'libmpi_*' -o -name 'liboshmem*' \
    -o -name 'libompitrace*' -o -name 'ompi_monitoring_prof*' -o -name 'libmca_common_ofi*' \
    -o -name 'libmca_common_ucx*' -o -name 'libmca_common_verbs*' \) -exec rm -f {} +
  find "$ompi/lib/openmpi3" \( -name 'mca_*ofi*' -o -name 'mca_*ucx*' -o -name 'mca_*uct*' \
    -o -name 'mca_*psm*' -o -name 'mca_btl_openib*' -o -name 'mca_btl_usnic*' \
    -o -name 'mca_reachable_netlink*' -o -name 'mca_atomic_*' -o -name 'mca_memheap_*' \
    -o -name 'mca_scoll_*' -o -name 'mca_spml_*' -o -name 'mca_sshmem_*' \) -exec rm -f {} +
  # C headers only (mpi.h and what it includes), the C wrapper's data, the four programs
  find "$ompi/include" -mindepth 1 -maxdepth 1 -not -name 'mpi.h' -not -name 'mpi-ext.h' \
    -not -name 'mpi_portable_platform.h' -exec rm -rf {} +
  find "$out/usr/share/openmpi" -name '*-wrapper-data.txt' -not -name 'mpicc-wrapper-data.txt' \
    -exec rm -f {} +
  rm -f "$out/usr/share/openmpi/mca-btl-openib-device-params.ini"
  # mpicc adds -I<includedir>/openmpi, the developer headers' folder, just removed: CMake's
  # FindMPI refuses an include folder that does not exist
  sed -i 's|^preprocessor_flags=.*|preprocessor_flags=|' "$out/usr/share/openmpi/mpicc-wrapper-data.txt"
  find "$out/usr/bin" -mindepth 1 -not -name orterun -not -name orted -not -name opal_wrapper \
    -not -name ompi_info -exec rm -f {} +
  # PMIx's own parameter file names its components' absolute folder: gpu-mpi-env.sh sets it
  sed -i 's|^mca_base_component_path *=|# (set by gpu-mpi-env.sh) &|' \
    "$lib/pmix2/share/pmix-mca-params.conf"
}

# Every shared library becomes one plain file named by its SONAME (the name the loader looks
# for) and every symbolic link goes: the folder may be copied by tools that drop links, and
# copies of links would hold each library three times.
flatten_libraries() { # OUT
  local out=$1 f so dir p
  while IFS= read -r f; do
    so=$(readelf -d "$f" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    [ -n "$so" ] || continue
    dir=$(dirname "$f")
    [ "$(basename "$f")" = "$so" ] && continue
    rm -f "${dir:?}/$so"
    mv "$f" "$dir/$so"
  done < <(find "$out" -type f -name '*.so*')
  find "$out" -type l -delete
  # the link-time name of the MPI library (mpicc's -lmpi, CMake's FindMPI)
  cp "$out/usr/lib/$TRIPLET/libmpi.so.40" "$out/usr/lib/$TRIPLET/openmpi/lib/libmpi.so"
  # each fallback library straight in its package's folder
  for p in "$out"/fallback/*/; do
    find "$p" -mindepth 2 -type f -name '*.so.*' -exec mv {} "$p" \;
    find "$p" -mindepth 1 -type d -exec rm -rf {} +
  done
}

add_openmpi_entry_points() { # OUT
  local bin=$1/usr/bin
  cp "$bin/orterun" "$bin/mpirun"
  cp "$bin/orterun" "$bin/mpiexec"
  cp "$bin/opal_wrapper" "$bin/mpicc" # reads share/openmpi/mpicc-wrapper-data.txt
}

# Uses the copy as the GPU machine will: a clean environment (env -i) with only
# scripts/gpu-mpi-env.sh, mpicc builds a program that sums 2 Mi integers over 3 ranks and
# mpirun runs it. As root with unshare(1), this machine's own Open MPI (its folders, programs
# and libraries) and ssh are first hidden in a private mount namespace, so that nothing of it
# can stand in for the copy; with strace(1), no file of those folders may even be opened.
check_relocated_openmpi() { # OUT
  local out=$1 work
  work=$(mktemp -d)
  cat >"$work/allreduce.c" <<'C'
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
  int rank, size;
  const int n = 2 << 20;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
  for (int i = 0; i < n; i++) a[i] = i % 1000 + rank;
  MPI_Allreduce(a, b, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  long wrong = 0;
  for (int i = 0; i < n; i++) wrong += b[i] != size * (i % 1000) + size * (size - 1) / 2;
  if (rank == 0) printf("allreduce of %d ints over %d ranks: %ld wrong\n", n, size, wrong);
  MPI_Finalize();
  return wrong != 0;
}
C
  cat >"$work/run.sh" <<'SH'
set -eu
. "$1/scripts/gpu-mpi-env.sh" "$2"
cd "$3"
case $(command -v mpirun) in "$GCOMP_MPI_ROOT"/*) ;; *) echo "mpirun is $(command -v mpirun)"; exit 1 ;; esac
prefix=$(ompi_info --path prefix | sed 's/^.*: *//')
[ "$prefix" = "$OPAL_PREFIX" ] || { echo "ompi_info says prefix $prefix"; exit 1; }
mpicc -O2 allreduce.c -o allreduce
ldd ./allreduce | grep -q "libmpi.so.40 => $GCOMP_MPI_ROOT/" || { ldd ./allreduce; exit 1; }
tracer=()
strace -o /dev/null true 2>/dev/null && tracer=(strace -f -qq -z -e trace=openat,execve -o trace.log)
timeout 120 "${tracer[@]}" mpirun -np 3 ./allreduce
if [ ${#tracer[@]} -gt 0 ]; then
  if grep -E '"(/usr)?/lib/x86_64-linux-gnu/(openmpi/|pmix2/|hwloc/|libmpi|libopen-|libpmix)|"/etc/openmpi/|"/usr/share/openmpi/' trace.log; then
    echo "files of the machine's Open MPI were opened"; exit 1
  fi
  echo "strace: $(grep -c "$GCOMP_MPI_ROOT" trace.log) files opened from the copy, none of the machine's Open MPI"
fi
SH
  cat >"$work/hide.sh" <<'SH'
for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /etc/openmpi /usr/share/openmpi; do
  [ -d "$d" ] && mount -t tmpfs none "$d"
done
find /usr/bin /usr/lib/x86_64-linux-gnu -maxdepth 1 -type f \( -name 'mpi*' -o -name 'orte*' \
  -o -name 'opal*' -o -name 'ompi*' -o -name ssh -o -name rsh -o -name 'libmpi*' -o -name 'libopen-*' \
  -o -name 'libpmix*' -o -name 'libhwloc*' -o -name 'libevent*' -o -name 'libmunge*' \
  -o -name 'libmca_common*' \) -exec mount --bind /dev/null {} \;
exec "$@"
SH
  local clean=(env -i "HOME=$HOME" PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
               bash "$work/run.sh" "$(pwd)" "$(dirname "$out")" "$work")
  if [ "$(id -u)" = 0 ] && unshare -m --propagation private true 2>/dev/null; then
    echo "gpu-deps: checking the copy with this machine's Open MPI and ssh hidden"
    unshare -m --propagation private bash "$work/hide.sh" "${clean[@]}"
  else
    echo "gpu-deps: checking the copy (not root or no unshare: this machine's Open MPI, if any, stays visible)"
    "${clean[@]}"
  fi
  rm -rf "$work"
}

# Every library an ELF file here needs is here, or is glibc's: fails otherwise, so a package
# missing from MPI_PACKAGES shows up now, not on the GPU machine. Prints the newest glibc
# symbol version used, which the GPU machine's glibc must have.
check_closure() { # OUT
  local out=$1 provided f n missing=0
  provided=" $(find "$out" -type f -name '*.so*' -printf '%f ') "
  while IFS= read -r f; do
    readelf -h "$f" >/dev/null 2>&1 || continue
    for n in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      case "$provided$GLIBC_SONAMES" in
        *" $n "*) ;;
        *) echo "gpu-deps: ${f#"$out"/} needs $n, which is neither here nor glibc's" >&2; missing=1 ;;
      esac
    done
  done < <(find "$out" -type f \( -name '*.so*' -o -path '*/bin/*' \))
  [ -z "$(find "$out" -type l)" ] || { echo "gpu-deps: symbolic links left in $out" >&2; missing=1; }
  echo "gpu-deps: Open MPI's files need glibc $(find "$out" -type f \( -name '*.so*' -o -path '*/bin/*' \) \
    -exec readelf -V {} + 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1 | sed 's/GLIBC_//')"
  return $missing
}

command -v apt-get >/dev/null || { echo "gpu-deps: needs apt-get (Debian/Ubuntu)" >&2; exit 1; }
rm -rf "$dest"
mkdir -p "$dest/debs"
dest=$(cd "$dest" && pwd)
(cd "$dest/debs" && apt-get download "${PACKAGES[@]}")
for deb in "$dest"/debs/*.deb; do
  dpkg-deb -x "$deb" "$dest/root"
done

# Keep what a build needs (headers, shared libraries, pkg-config files); drop docs and the
# static zstd archive, so the folder stays small enough to travel with the tree.
rm -rf "$dest/root/usr/share" "$dest/root/usr/lib/x86_64-linux-gnu/libzstd.a" "$dest/debs"
# Symbolic links become plain copies: the folder is copied to the GPU machine by tools that
# may not keep links.
find "$dest/root" -type l | while read -r link; do
  target=$(readlink -f "$link")
  rm "$link"
  cp "$target" "$link"
done
# .pc files name /usr (cmocka's spells it out, zstd's libdir says lib, not lib/<triplet>); make
# them point at this folder wherever it is copied to. ${pcfiledir} (usr/lib/<triplet>/pkgconfig)
# is understood by pkg-config and pkgconf alike. CMake package files are dropped: the build
# finds these libraries through pkg-config only.
rm -rf "$dest"/root/usr/lib/*/cmake
for pc in "$dest"/root/usr/lib/*/pkgconfig/*.pc; do
  sed -i -e 's|^prefix=.*|prefix=${pcfiledir}/../../..|' \
         -e 's|^libdir=.*|libdir=${pcfiledir}/..|' \
         -e 's|-L/usr/lib/[^ ]*|-L${pcfiledir}/..|g' \
         -e 's|-I/usr/include|-I${pcfiledir}/../../../include|g' "$pc"
done

exclude=$(git rev-parse --git-common-dir 2>/dev/null)/info/exclude
if [ -n "${exclude%/info/exclude}" ] && [ "$dest" = "$(pwd)/.gpu-deps" ]; then
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.gpu-deps/' "$exclude" 2>/dev/null || echo '/.gpu-deps/' >>"$exclude"
fi
echo "gpu-deps: ${PACKAGES[*]} unpacked into $dest/root"

# (an if, not ||: set -e must hold inside the function)
if [ "${GPU_DEPS_MPI:-1}" != 0 ]; then fetch_openmpi "$dest/openmpi"; fi
echo "gpu-deps: $dest holds $(du -sh "$dest" | cut -f1)"
