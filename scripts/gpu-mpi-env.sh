# gpu-mpi-env.sh — source it (`. scripts/gpu-mpi-env.sh [DEPS_DIR]`) to use the Open MPI that
# scripts/gpu-deps.sh unpacked into .gpu-deps/openmpi, from wherever that folder now lies, on a
# machine with no Open MPI of its own (the GPU machine). Afterwards mpirun, mpiexec, mpicc and
# ompi_info are that copy's, and CMake finds it with -DMPI_C_COMPILER="$GCOMP_MPICC".
#
# Debian built that Open MPI for /usr: each of its install folders is given here through the
# OPAL_* variables Open MPI reads at start-up, and PMIx's through the PMIX_* ones (without
# them, a machine that has Debian's Open MPI too would load PMIx's plugins from there). The
# MCA settings suit one node in a container: ranks talk through shared memory only (the
# components for InfiniBand, UCX and libfabric were left out), with no single-copy mechanism
# (CMA needs ptrace rights a container may lack), no process binding (ranks share the one
# GPU) and no ssh (every rank is local: plm isolated).
# Returns 1, changing nothing, when the folder is missing.
_gme_deps=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.gpu-deps}
# a copy made by a tool that drops modes: the programs get their execute bit back
if [ -f "$_gme_deps/openmpi/usr/bin/mpirun" ] && [ ! -x "$_gme_deps/openmpi/usr/bin/mpirun" ]; then
  chmod +x "$_gme_deps"/openmpi/usr/bin/*
fi
if [ ! -x "$_gme_deps/openmpi/usr/bin/mpirun" ]; then
  echo "gpu-mpi-env: no Open MPI in $_gme_deps/openmpi (run scripts/gpu-deps.sh where apt works)" >&2
  unset _gme_deps
  return 1
fi
_gme_root=$(cd "$_gme_deps/openmpi" && pwd)
_gme_lib=$_gme_root/usr/lib/x86_64-linux-gnu

export GCOMP_MPI_ROOT=$_gme_root
export GCOMP_MPICC=$_gme_root/usr/bin/mpicc
export GCOMP_MPIEXEC=$_gme_root/usr/bin/mpiexec
export OPAL_PREFIX=$_gme_root/usr
export OPAL_EXEC_PREFIX=$OPAL_PREFIX
export OPAL_BINDIR=$OPAL_PREFIX/bin
export OPAL_LIBDIR=$_gme_lib/openmpi/lib
export OPAL_PKGLIBDIR=$OPAL_LIBDIR/openmpi3
export OPAL_INCLUDEDIR=$_gme_lib/openmpi/include
export OPAL_DATAROOTDIR=$OPAL_PREFIX/share
export OPAL_DATADIR=$OPAL_PREFIX/share
export OPAL_PKGDATADIR=$OPAL_PREFIX/share/openmpi
export OPAL_SYSCONFDIR=$_gme_root/etc/openmpi
export PMIX_PREFIX=$_gme_lib/pmix2
export PMIX_EXEC_PREFIX=$PMIX_PREFIX
export PMIX_LIBDIR=$PMIX_PREFIX/lib
export PMIX_PKGLIBDIR=$PMIX_PREFIX/lib/pmix
export PMIX_DATAROOTDIR=$PMIX_PREFIX/share
export PMIX_DATADIR=$PMIX_PREFIX/share
export PMIX_PKGDATADIR=$PMIX_PREFIX/share/pmix
export PMIX_SYSCONFDIR=$PMIX_PREFIX/share
export PMIX_MCA_mca_base_component_path=$PMIX_PKGLIBDIR
# hwloc's plugins (PCI, OpenCL, libxml2...) are not carried: without this hwloc would load the
# machine's, built for another hwloc, from its compiled-in /usr/lib/x86_64-linux-gnu/hwloc
export HWLOC_PLUGINS_PATH=$_gme_lib/hwloc-plugins-none
# PMIx's shared-memory store and munge security are of no use on one node and known to fail
# in containers: the hash store and native security always work.
export PMIX_MCA_gds=hash
export PMIX_MCA_psec=native

export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_pml=ob1
export OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_hwloc_base_binding_policy=none
export OMPI_MCA_plm=isolated
export OMPI_MCA_btl_base_warn_component_unused=0

# A library of fallback/ only where the machine has none (ldconfig's cache, else the usual
# folders), so that a system copy, likely newer, is never shadowed.
_gme_path=$_gme_lib:$_gme_lib/openmpi/lib:$_gme_lib/pmix2/lib
for _gme_dir in "$_gme_root"/fallback/*/; do
  for _gme_so in "$_gme_dir"*.so.*; do
    [ -e "$_gme_so" ] || continue
    _gme_name=$(basename "$_gme_so")
    if { command -v ldconfig >/dev/null && ldconfig -p 2>/dev/null | awk '{print $1}' | grep -qxF "$_gme_name"; } ||
       [ -e "/lib/x86_64-linux-gnu/$_gme_name" ] || [ -e "/usr/lib/x86_64-linux-gnu/$_gme_name" ] ||
       [ -e "/usr/lib64/$_gme_name" ] || [ -e "/lib64/$_gme_name" ]; then
      continue
    fi
    _gme_path=$_gme_path:${_gme_dir%/}
    echo "gpu-mpi-env: $_gme_name from ${_gme_dir%/} (the machine has none)" >&2
  done
done
export LD_LIBRARY_PATH=$_gme_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$OPAL_BINDIR:$PATH
unset _gme_deps _gme_root _gme_lib _gme_path _gme_dir _gme_so _gme_name
