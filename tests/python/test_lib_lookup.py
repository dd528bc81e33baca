"""gcomp._lib's search for libgcomp.so, without MPI: a copy of the package installed beside
some build tree (pip --target DIR/tgt, next to DIR/build-cpu) must not load that build's
library, while the package inside a checkout loads its own checkout's build*/libgcomp.so,
passing by a sanitizer build.
test_binding.py runs it on rank 0.

Run: /usr/bin/python3 tests/python/test_lib_lookup.py build/libgcomp.so
"""
import os
import shutil
import subprocess
import sys
import tempfile

PKG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "gcomp")


def loaded(pythonpath):
    """gcomp.library_path in a fresh interpreter importing gcomp from pythonpath, with no
    GCOMP_LIBRARY; None when no library was found."""
    env = dict(os.environ, PYTHONPATH=pythonpath)
    env.pop("GCOMP_LIBRARY", None)
    r = subprocess.run([sys.executable, "-c", "import gcomp; print(gcomp.library_path)"],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        assert "libgcomp.so not found" in r.stderr, r.stderr
        return None
    return r.stdout.strip()


def copy_package(dest):
    # a libgcomp.so inside python/gcomp would be found second, before any build tree
    shutil.copytree(PKG, dest, ignore=shutil.ignore_patterns("__pycache__", "libgcomp.so*"))


def check(lib):
    with tempfile.TemporaryDirectory() as d:
        build_lib = os.path.join(d, "build-cpu", "libgcomp.so")
        os.mkdir(os.path.dirname(build_lib))
        shutil.copy(lib, build_lib)
        copy_package(os.path.join(d, "tgt", "gcomp"))
        got = loaded(os.path.join(d, "tgt"))
        assert got is None or not os.path.realpath(got).startswith(os.path.realpath(d)), \
            "an installed copy loaded the unrelated build tree beside it: %s" % got
        # the same folder made a gcomp checkout: now build-cpu/ is the package's own build
        os.mkdir(os.path.join(d, "include"))
        for f in ("CMakeLists.txt", os.path.join("include", "gcomp.h")):
            open(os.path.join(d, f), "w").close()
        copy_package(os.path.join(d, "python", "gcomp"))
        got = loaded(os.path.join(d, "python"))
        assert got is not None and os.path.samefile(got, build_lib), \
            "the checkout's package did not load its build tree: %s" % got
        # a sanitizer build sorted first (build-a-asan/ < build-cpu/) is passed by: its
        # library would abort this Python ("ASan runtime does not come first")
        asan = os.path.join(d, "build-a-asan")
        os.mkdir(asan)
        shutil.copy(lib, os.path.join(asan, "libgcomp.so"))
        # -DGCOMP_SANITIZE=1 (or on, TRUE, ...) is written to the cache as given
        for value in ("ON", "1", "on", "TRUE"):
            with open(os.path.join(asan, "CMakeCache.txt"), "w") as f:
                f.write("GCOMP_SANITIZE:BOOL=%s\n" % value)
            got = loaded(os.path.join(d, "python"))
            assert got is not None and os.path.samefile(got, build_lib), \
                "the checkout's package loaded a sanitizer build (%s): %s" % (value, got)
    print("library lookup: an installed copy ignores the build tree beside it; "
          "a checkout's package loads its own, not a sanitizer build", flush=True)


if __name__ == "__main__":
    check(sys.argv[1] if len(sys.argv) > 1 else os.environ["GCOMP_LIBRARY"])
