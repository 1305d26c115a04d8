#!/bin/sh
# The Python package (python/, README "Python"): installed with pip from a copy of python/
# into a scratch directory, against this build tree's libtartan, then its pytest suite run
# with this build's `tartan` command (the command-versus-package parity tests use it).
# Skipped (77) in sanitizer builds (an instrumented libtartan cannot be loaded into an
# uninstrumented python3) and where python3 lacks NumPy, pytest, setuptools, wheel or its
# headers (.ci/deps installs them).
set -e
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
PYTHON=${PYTHON:-python3}
if [ -n "${SAN_FLAGS:-}" ]; then
    echo "sanitizer build: the Python package is tested in the plain build"
    exit 77
fi
if ! "$PYTHON" -c 'import numpy, pytest, setuptools, wheel, sysconfig, os, sys
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
    2>/dev/null; then
    echo "$PYTHON lacks numpy, pytest, setuptools, wheel or Python.h: skipped"
    exit 77
fi
src=$(cd "$top_srcdir" && pwd)
build=$(cd "$top_builddir" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A copy, so that pip's build directory never lands in the source tree.
cp -R "$src/python" "$tmp/pkg"
rm -rf "$tmp/pkg/build" "$tmp/pkg/src/tartan/"*.so "$tmp/pkg/src/tartan/"*.so.*
TARTAN_SRCDIR=$src TARTAN_BUILDDIR=$build PIP_ROOT_USER_ACTION=ignore \
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
    --no-deps --no-cache-dir --target "$tmp/site" "$tmp/pkg"
cd "$tmp/pkg"
PYTHONPATH="$tmp/site" TARTAN_BIN="$build/tartan" PYTHONDONTWRITEBYTECODE=1 \
    "$PYTHON" -m pytest -q -p no:cacheprovider tests
