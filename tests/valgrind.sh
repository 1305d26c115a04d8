#!/usr/bin/env bash
# valgrind.sh: the tool's index commands under valgrind memcheck: gen, build (training, FAISS
# k-means, encoding, LMDB writes), add, delete, info, check, and search where this build has
# it. Any invalid read or write, use of uninitialised memory in a decision, or definite leak
# fails it. Not in `make check` (valgrind slows the build's k-means some fifty times); run it
# by hand from the build directory:
#   top_builddir=. tests/valgrind.sh        (TARTAN_VALGRIND_DOCS, default 200)
# OpenMP's thread pool and FAISS keep blocks until exit on purpose: only definite leaks count.
set -u
top_builddir=${top_builddir:-.}
tartan=$top_builddir/tartan
docs=${TARTAN_VALGRIND_DOCS:-200}
command -v valgrind >/dev/null || { echo "valgrind.sh: valgrind not installed: skipped"; exit 77; }
work=$(mktemp -d /tmp/tartan-valgrind-XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=2
vg() {
    local name=$1
    shift
    local t0=$(date +%s)
    # ./tartan is libtool's wrapper script: run the real program under valgrind.
    "$top_builddir/libtool" --mode=execute valgrind --tool=memcheck --error-exitcode=99 --leak-check=full \
        --errors-for-leak-kinds=definite --show-leak-kinds=definite --track-origins=yes \
        --log-file="$work/vg-$name.log" "$tartan" "$@" >"$work/$name.out" 2>&1
    local rc=$?
    local t=$(( $(date +%s) - t0 ))
    local errs=$(grep -o 'ERROR SUMMARY: [0-9]*' "$work/vg-$name.log" | grep -o '[0-9]*$' |
        awk '{ s += $1 } END { print NR ? s : "?" }')
    echo "valgrind.sh: tartan $name: exit $rc, ${errs:-?} errors, ${t}s"
    if [ "$rc" = 99 ] || [ "${errs:-1}" != 0 ]; then
        sed -n '/Invalid\|uninitialised\|definitely lost\|Mismatched/,+14p' \
            "$work/vg-$name.log" | head -60
        status=1
    elif [ "$rc" != 0 ] && [ "${expect_fail:-0}" != 1 ]; then
        cat "$work/$name.out"
        status=1
    fi
}
status=0
"$tartan" gen "$work/c" --docs "$docs" --dim 64 --doc-len 20 --queries 4 >/dev/null
"$tartan" gen "$work/d" --docs 50 --dim 64 --doc-len 20 --queries 1 --seed 7 >/dev/null
seq 0 49 | sed 's/^/extra-/' >"$work/d.ids"
vg gen gen "$work/g" --docs 20 --dim 32 --doc-len 8 --queries 2
vg build build "$work/ix" --embeddings "$work/c/embeddings.npy" --doclens "$work/c/doclens.npy" \
    --ids "$work/c/ids.txt" --centroids 64
vg add add "$work/ix" --embeddings "$work/d/embeddings.npy" --doclens "$work/d/doclens.npy" \
    --ids "$work/d.ids"
vg delete delete "$work/ix" --ids "$work/d.ids"
vg info info "$work/ix"
vg check check "$work/ix"
if "$tartan" --help | grep -q '^  search'; then
    vg search search "$work/ix" --queries "$work/c/queries.npy" -k 10 -o "$work/run.txt"
    vg search-exhaustive search "$work/ix" --queries "$work/c/queries.npy" -k 10 \
        --exhaustive -o "$work/run-exhaustive.txt"
fi
# Bad input takes the error paths: they must free what they took too.
expect_fail=1 vg add-bad add "$work/ix" --embeddings "$work/d/doclens.npy" \
    --doclens "$work/d/doclens.npy"
exit $status
