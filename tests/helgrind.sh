#!/usr/bin/env bash
# helgrind.sh: the reader/writer test (check_reliability's concurrent_search: three threads
# search one handle and call tartan_info while the main thread adds and deletes) under
# valgrind's Helgrind and then DRD. Any race they report fails it, apart from LMDB's lock-free
# reader protocol (tests/helgrind.supp says which and why). About 10 s in all.
#
# One OpenMP thread: GCC's libgomp synchronises through futexes that neither tool can see, so
# its parallel regions would all be reported. The OpenMP paths are checked by ThreadSanitizer
# with LLVM's libomp and its Archer tool at four threads instead (.ci/sanitizers).
# Skipped (77) without valgrind, and in sanitizer builds (valgrind cannot run them).
set -u
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
command -v valgrind >/dev/null || { echo "helgrind.sh: valgrind not installed: skipped"; exit 77; }
[ -z "${SAN_FLAGS:-}" ] || { echo "helgrind.sh: sanitizer build: skipped"; exit 77; }
prog=$top_builddir/tests/check_reliability
supp=$top_srcdir/tests/helgrind.supp
work=$(mktemp -d /tmp/tartan-helgrind-XXXXXX)
trap 'rm -rf "$work"' EXIT
# DRD reads the same entries under its own kind name.
sed 's/Helgrind:Race/drd:ConflictingAccess/' "$supp" >"$work/drd.supp"
status=0
for tool in helgrind drd; do
    s=$supp
    [ "$tool" = drd ] && s=$work/drd.supp
    t0=$(date +%s)
    CK_FORK=no CK_RUN_CASE=concurrent_search CK_DEFAULT_TIMEOUT=600 OMP_NUM_THREADS=1 \
        valgrind --tool=$tool --error-exitcode=99 --suppressions="$s" \
        --log-file="$work/$tool.log" "$prog" >"$work/$tool.out" 2>&1
    rc=$?
    errs=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) errors.*/\1/p' "$work/$tool.log" | tail -1)
    supd=$(sed -n 's/.*(suppressed: \([0-9]*\) from.*/\1/p' "$work/$tool.log" | tail -1)
    echo "helgrind.sh: $tool: exit $rc, ${errs:-?} errors (${supd:-?} suppressed), $(( $(date +%s) - t0 )) s"
    if [ "$rc" != 0 ] || [ "${errs:-1}" != 0 ]; then
        cat "$work/$tool.out"
        grep -E -A24 'Possible data race|Conflicting (load|store)|Thread #[0-9]+.*(lock|unlock)' \
            "$work/$tool.log" | head -120
        status=1
    fi
done
exit $status
