#!/usr/bin/env bash
# check_fuzz.sh: builds the libFuzzer targets of tests/fuzz/ with clang (AddressSanitizer and
# UndefinedBehaviorSanitizer on, coverage on the library and the readers too) and runs each
# for TARTAN_FUZZ_SECONDS (default 5) from its seed corpus in tests/fuzz/corpus/<target>/.
# New inputs go to a temporary directory, never into the repository. A crash leaves its input
# in $top_builddir/tests/fuzz/crashes/ and fails the test. Exits 77 (skipped) without clang
# or libFuzzer.
#
# Knobs: TARTAN_FUZZ_SECONDS, TARTAN_FUZZ_TARGETS (a subset, space-separated), CC_FUZZ and
# CXX_FUZZ (default clang, clang++).
set -u
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
secs=${TARTAN_FUZZ_SECONDS:-5}
targets=${TARTAN_FUZZ_TARGETS:-"fuzz_npy fuzz_idlist fuzz_qrels fuzz_trec_run fuzz_add fuzz_search"}
cc=${CC_FUZZ:-clang}
cxx=${CXX_FUZZ:-clang++}
src=$top_srcdir
out=$top_builddir/tests/fuzz/build
crashes=$top_builddir/tests/fuzz/crashes

command -v "$cc" >/dev/null && command -v "$cxx" >/dev/null || {
    echo "check_fuzz: $cc / $cxx not found: skipped"
    exit 77
}
probe=$(mktemp -d /tmp/tartan-fuzzprobe-XXXXXX)
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return 0; }' \
    >"$probe/p.c"
if ! "$cc" -fsanitize=fuzzer,address "$probe/p.c" -o "$probe/p" 2>/dev/null; then
    rm -rf "$probe"
    echo "check_fuzz: $cc cannot link libFuzzer (Debian: libclang-rt-14-dev): skipped"
    exit 77
fi
# clang's OpenMP (Debian: libomp-14-dev) for the library's omp pragmas; without it the pragmas
# are ignored and GCC's libgomp serves the kernels and FAISS.
omp=-fopenmp
omp_lib=
echo 'int main(void) { return 0; }' >"$probe/o.c"
if ! "$cc" -fopenmp "$probe/o.c" -o "$probe/o" 2>/dev/null; then
    omp=
    omp_lib=-lgomp
fi
rm -rf "$probe"
[ -f "$top_builddir/config.h" ] || { echo "check_fuzz: no config.h in $top_builddir" >&2; exit 1; }

mkdir -p "$out" "$crashes"
# The fuzz build is CPU-only whatever configure chose: its own config.h without the CUDA
# kernels (dispatch.c then answers KERN_ENODEV for the GPU instead of calling them).
grep -v 'TARTAN_HAVE_CUDA' "$top_builddir/config.h" >"$out/config.h.new"
cmp -s "$out/config.h.new" "$out/config.h" 2>/dev/null || mv "$out/config.h.new" "$out/config.h"
rm -f "$out/config.h.new"
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# The kernels use OpenMP; clang's runtime (libomp) also answers FAISS's GOMP_ calls.
cflags="-g -O1 -std=gnu11 $omp $san -fsanitize=fuzzer-no-link -DHAVE_CONFIG_H \
    -I$out -I$src/engine -I$src/kernels -I$src/storage -I$src/index -I$src/tools"
cxxflags="-g -O1 -std=c++17 $omp $san -fsanitize=fuzzer-no-link -I$src/index"

# Compiles src file $1 into $out unless the object is newer than it, the headers and config.h.
newest_header=$(ls -t "$src"/*/*.h | head -1)
compile() {
    local f=$1 o=$out/$(echo "$1" | tr / _).o
    if [ ! -f "$o" ] || [ "$src/$f" -nt "$o" ] || [ "$newest_header" -nt "$o" ] ||
        [ "$out/config.h" -nt "$o" ]; then
        case $f in
        *.cpp) $cxx $cxxflags -c "$src/$f" -o "$o" ;;
        # The kernels use GCC's CPU-feature builtins (clang 14 lacks "f16c") and parse no
        # input: gcc builds them, uninstrumented.
        kernels/*) ${CC_KERNELS:-gcc} -g -O2 -std=gnu11 -fopenmp -DHAVE_CONFIG_H \
            -I$out -I$src/kernels -c "$src/$f" -o "$o" ;;
        *) $cc $cflags -c "$src/$f" -o "$o" ;;
        esac || return 1
    fi
    echo "$o"
}

objs() {
    local list=() o
    for f in "$@"; do
        o=$(compile "$f") || return 1
        list+=("$o")
    done
    echo "${list[@]}"
}

readers="tools/errbuf.c tools/npy.c tools/strtab.c tools/textfile.c tools/fields.c \
    tools/idlist.c tools/array.c tools/qrels.c tools/trec_run.c engine/errors.c"
library=$(cd "$src" && ls kernels/*.c storage/*.c index/*.c engine/*.c) 
libs="-lfaiss -llmdb -lopenblas -llapack -lstdc++ -lm -lpthread"

echo "check_fuzz: building into $out"
reader_objs=$(objs $readers) || { echo "check_fuzz: build failed" >&2; exit 1; }
lib_objs=
if [[ " $targets " == *" fuzz_add "* || " $targets " == *" fuzz_search "* ]]; then
    lib_objs="$(objs $library index/faiss_bridge.cpp)" || {
        echo "check_fuzz: build failed" >&2
        exit 1
    }
fi
for t in $targets; do
    o=$(compile "tests/fuzz/$t.c") || exit 1
    case $t in
    fuzz_add | fuzz_search) $cxx $omp $san -fsanitize=fuzzer "$o" $lib_objs $libs $omp_lib -o "$out/$t" ;;
    *) $cc $san -fsanitize=fuzzer "$o" $reader_objs -lm -o "$out/$t" ;;
    esac || { echo "check_fuzz: linking $t failed" >&2; exit 1; }
done

work=$(mktemp -d /tmp/tartan-fuzz-XXXXXX)
trap 'rm -rf "$work"' EXIT
status=0
for t in $targets; do
    mkdir -p "$work/$t"
    # LeakSanitizer stays on: the readers must free what they allocate.
    if ASAN_OPTIONS=${ASAN_OPTIONS:-} UBSAN_OPTIONS=print_stacktrace=1 \
        "$out/$t" -max_total_time="$secs" -timeout=20 -rss_limit_mb=4096 -max_len=4096 \
        -print_final_stats=1 -artifact_prefix="$work/$t-" \
        "$work/$t" "$src/tests/fuzz/corpus/$t" >"$work/$t.log" 2>&1; then
        runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t.log" | grep -o '[0-9]*$')
        echo "check_fuzz: $t: ${runs:-?} runs in ${secs}s, no failure"
    else
        status=1
        echo "check_fuzz: $t FAILED:" >&2
        grep -E 'ERROR|SUMMARY|runtime error|#[0-9] ' "$work/$t.log" | head -30 >&2
        for c in "$work/$t"-*; do
            [ -f "$c" ] && cp "$c" "$crashes/" && echo "check_fuzz: input kept: $crashes/$(basename "$c")" >&2
        done
    fi
done
exit $status
