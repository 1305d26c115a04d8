#!/bin/sh
# The shared library exports only the public API: every dynamic symbol it defines starts with
# tartan_ (STYLE.md). Fails if a kern_, store_, idx_, eng_, FAISS or CUDA symbol leaks.
set -e
lib=${top_builddir:-.}/.libs/libtartan.so
if [ ! -f "$lib" ]; then
    echo "no shared library at $lib (built with --disable-shared?): skipped"
    exit 77
fi
leaks=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[A-Za-z]$/ && $2 != "w" && $2 != "V" {print $3}' |
        grep -v '^tartan_' | grep -v '^_init$' | grep -v '^_fini$' | grep -v '^_edata$' |
        grep -v '^_end$' | grep -v '^__bss_start$' || true)
if [ -n "$leaks" ]; then
    echo "libtartan.so exports symbols outside the tartan_ namespace:"
    echo "$leaks" | head -20
    exit 1
fi
n=$(nm -D --defined-only "$lib" | grep -c ' tartan_' || true)
if [ "$n" -lt 3 ]; then
    echo "libtartan.so exports only $n tartan_ symbols"
    exit 1
fi
echo "libtartan.so exports $n symbols, all tartan_"
