"""Builds tartan's extension module (src/tartan/_tartan.c) against libtartan.

Where libtartan comes from, first match wins:
  1. a build tree: $TARTAN_BUILDDIR, else this repository's root (the one above python/), when
     its .libs/libtartan.so exists (after ./configure && make). The shared library is copied
     into the package and found through an $ORIGIN rpath, so the installed package does not
     depend on the build tree staying where it was;
  2. an installed libtartan (`make install`), through `pkg-config tartan`; the extension gets an
     rpath to its libdir.
The extension also compiles the tool's evaluation sources (tools/metrics.c, evaluate.c and
their readers) from the repository, so `tartan.evaluate` is the code of `tartan eval`.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
SRCDIR = os.path.abspath(os.environ.get("TARTAN_SRCDIR", os.path.join(HERE, "..")))
TOOLS = os.path.join(SRCDIR, "tools")
# The tool's files that evaluation needs, and nothing of the library's internals.
EVAL_SOURCES = ["metrics.c", "evaluate.c", "qrels.c", "trec_run.c", "strtab.c", "textfile.c",
                "fields.c", "errbuf.c", "array.c"]


def find_library():
    """(include_dirs, library_dirs, bundled .so path or None, rpath) for libtartan."""
    builddir = os.path.abspath(os.environ.get("TARTAN_BUILDDIR", SRCDIR))
    so = os.path.join(builddir, ".libs", "libtartan.so")
    if os.path.exists(so):
        return [os.path.join(SRCDIR, "engine")], [os.path.dirname(so)], so, "$ORIGIN"
    try:
        cflags = subprocess.run(["pkg-config", "--cflags-only-I", "tartan"], check=True,
                                capture_output=True, text=True).stdout
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "tartan"], check=True,
                                capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        sys.exit("tartan: no libtartan found. Build it first in the repository root "
                 "(./autogen.sh && ./configure && make), or `make install` it, or set "
                 "TARTAN_BUILDDIR to the build tree.")
    incs = [f[2:] for f in shlex.split(cflags) if f.startswith("-I")]
    return incs, [libdir], None, libdir


INCS, LIBDIRS, BUNDLED, RPATH = find_library()


class BuildExt(build_ext):
    """Copies the build tree's libtartan beside the extension (bundled mode)."""

    def run(self):
        super().run()
        if BUNDLED:
            real = os.path.realpath(BUNDLED)  # libtartan.so.0.0.0
            dest_dir = os.path.join(self.build_lib, "tartan")
            os.makedirs(dest_dir, exist_ok=True)
            # The extension's DT_NEEDED is the soname, libtartan.so.0.
            shutil.copyfile(real, os.path.join(dest_dir, "libtartan.so.0"))
            if self.inplace:
                shutil.copyfile(real, os.path.join(HERE, "src", "tartan", "libtartan.so.0"))

    def get_outputs(self):
        out = super().get_outputs()
        if BUNDLED:
            out.append(os.path.join(self.build_lib, "tartan", "libtartan.so.0"))
        return out


ext = Extension(
    "tartan._tartan",
    sources=["src/tartan/_tartan.c"] + [os.path.relpath(os.path.join(TOOLS, f), HERE)
                                        for f in EVAL_SOURCES],
    include_dirs=INCS + [TOOLS],
    library_dirs=LIBDIRS,
    libraries=["tartan"],
    runtime_library_dirs=[RPATH],
    # C11 as the rest of the project; hidden visibility keeps the tool's symbols private
    # (PyInit__tartan is exported by PyMODINIT_FUNC).
    extra_compile_args=["-std=gnu11", "-fvisibility=hidden", "-Wall", "-Wextra",
                        "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
)

setup(ext_modules=[ext], cmdclass={"build_ext": BuildExt})
