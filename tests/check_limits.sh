#!/usr/bin/env bash
# check_limits.sh: resources and limits through the tool.
#  1. Files and directories the tool creates get 0666/0777 narrowed by the umask (0644/0755
#     under umask 022, 0640/0750 under 027), the index's own files included.
#  2. A full disk during `tartan add`: a tmpfs of a few MiB where mounting is allowed (root),
#     else a file size limit (ulimit -f, SIGXFSZ ignored). The add fails with ENOSPC or EFBIG
#     and a message, and the index is as it was: it passes `tartan check`, holds the same ids,
#     and takes a small add afterwards.
#  3. .npy headers announcing huge arrays (10^12 rows, a 10^9 dimension, an 4 GiB header) are
#     refused from the header, before anything that size is allocated: the process runs under
#     a 2 GiB address-space limit and the error is the file's (TARTAN_ETRUNC/EFORMAT), never
#     ENOMEM.
set -u
top_builddir=${top_builddir:-.}
tartan=$top_builddir/tartan
list_ids=$top_builddir/tests/list_ids
work=$(mktemp -d /tmp/tartan-limits-XXXXXX)
mnt=
cleanup() {
    [ -n "$mnt" ] && umount "$mnt" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    echo "check_limits: FAIL: $*" >&2
    exit 1
}

# ---- 1. permissions ---------------------------------------------------------------------
for mask in 022 027; do
    (
        umask $mask
        "$tartan" gen "$work/g$mask" --docs 50 --dim 32 --doc-len 10 --queries 2 >/dev/null &&
            "$tartan" build "$work/ix$mask" --embeddings "$work/g$mask/embeddings.npy" \
                --doclens "$work/g$mask/doclens.npy" --centroids 16 >/dev/null 2>&1
    ) || fail "gen/build under umask $mask"
    fmode=$(printf '%o' $((0666 & ~0$mask)))
    dmode=$(printf '%o' $((0777 & ~0$mask)))
    for f in "$work/g$mask"/* "$work/ix$mask"/*; do
        m=$(stat -c %a "$f")
        [ "$m" = "$fmode" ] || fail "umask $mask: $f has mode $m, expected $fmode"
    done
    for d in "$work/g$mask" "$work/ix$mask"; do
        m=$(stat -c %a "$d")
        [ "$m" = "$dmode" ] || fail "umask $mask: directory $d has mode $m, expected $dmode"
    done
done
echo "check_limits: created files and directories follow the umask (022, 027)"

# ---- 2. full disk -----------------------------------------------------------------------
"$tartan" gen "$work/small" --docs 100 --dim 64 --doc-len 20 --queries 1 --seed 1 >/dev/null
"$tartan" gen "$work/big" --docs 4000 --dim 64 --doc-len 40 --queries 1 --seed 2 >/dev/null
seq 0 3999 | sed 's/^/big-/' >"$work/big.ids"
seq 0 99 | sed "s/^/more-/" >"$work/more.ids"
mkdir -p "$work/mnt"
limit=none
if [ -z "${TARTAN_LIMITS_NO_MOUNT:-}" ] && [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=3m tmpfs "$work/mnt" 2>/dev/null; then
    mnt=$work/mnt
    limit="a 3 MiB tmpfs"
fi
ix=$work/mnt/ix
"$tartan" build "$ix" --embeddings "$work/small/embeddings.npy" \
    --doclens "$work/small/doclens.npy" --centroids 64 >/dev/null 2>&1 || fail "build"
"$list_ids" "$ix" >"$work/ids.before" || fail "list_ids"
size_kb=$(( $(stat -c %s "$ix/data.mdb") / 1024 ))
add_big() {
    if [ -n "$mnt" ]; then
        "$tartan" add "$ix" --embeddings "$work/big/embeddings.npy" \
            --doclens "$work/big/doclens.npy" --ids "$work/big.ids" --batch 100000
    else
        # The file may grow by 1 MiB; the batch needs far more. SIGXFSZ ignored: write()
        # then fails with EFBIG, which is what the index must survive.
        (
            trap '' XFSZ
            ulimit -f $((size_kb + 1024))
            exec "$tartan" add "$ix" --embeddings "$work/big/embeddings.npy" \
                --doclens "$work/big/doclens.npy" --ids "$work/big.ids" --batch 100000
        )
    fi
}
[ -n "$mnt" ] || limit="a file size limit of $((size_kb + 1024)) KiB"
add_big >"$work/add.out" 2>&1 && fail "an add larger than $limit succeeded"
grep -qE 'ENOSPC|EFBIG|No space|too large' "$work/add.out" ||
    fail "the failed add does not say why: $(cat "$work/add.out")"
"$tartan" check "$ix" >"$work/check.out" 2>&1 ||
    fail "tartan check after the full disk: $(cat "$work/check.out")"
"$list_ids" "$ix" >"$work/ids.after" || fail "list_ids after the full disk"
cmp -s "$work/ids.before" "$work/ids.after" || fail "the index changed under the failed add"
"$tartan" add "$ix" --embeddings "$work/small/embeddings.npy" --doclens "$work/small/doclens.npy" \
    --ids "$work/more.ids" >/dev/null 2>&1 ||
    fail "a small add after the full disk failed"
"$tartan" check "$ix" >/dev/null 2>&1 || fail "tartan check after the small add"
echo "check_limits: an add beyond $limit failed cleanly ($(grep -oE 'ENOSPC|EFBIG' \
    "$work/add.out" | head -1)); index unchanged and usable"
[ -n "$mnt" ] && { umount "$mnt"; mnt=; }

# ---- 3. huge arrays announced by .npy headers -------------------------------------------
# npy FILE DESCR SHAPE [VERSION]: a header with no data after it.
npy() {
    local dict="{'descr': '$2', 'fortran_order': False, 'shape': $3, }"
    local pad=$(( (64 - (10 + ${#dict} + 1) % 64) % 64 ))
    {
        printf '\x93NUMPY\x01\x00'
        printf "\\x$(printf %02x $(( (${#dict} + pad + 1) % 256 )))\\x$(printf %02x $(( (${#dict} + pad + 1) / 256 )))"
        printf '%s%*s\n' "$dict" "$pad" ''
    } >"$1"
}
npy "$work/rows.npy" '<f4' '(1000000000000, 128)'
npy "$work/dim.npy" '<f4' '(1, 1000000000)'
npy "$work/lens.npy" '<i4' '(1000000000000,)'
npy "$work/lens1.npy" '<i4' '(1,)'
printf '\x93NUMPY\x02\x00\xf0\xff\xff\xff{' >"$work/hdr.npy"
# Few threads: each reserves address space of its own (stacks, malloc arenas, OpenBLAS
# buffers) that has nothing to do with the file. AddressSanitizer's shadow needs terabytes of
# address space: under it the limit is left off (the error code still shows no allocation).
vlimit=$((2 * 1024 * 1024))
export OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=1
if ! { (ulimit -v $vlimit && exec "$tartan" --version) >/dev/null 2>&1; } 2>/dev/null; then
    vlimit=unlimited
fi
try_add() { # EMB LENS EXPECTED-CODE
    (
        ulimit -v $vlimit
        exec "$tartan" add "$work/ix022" --embeddings "$1" --doclens "$2"
    ) >"$work/npy.out" 2>&1 && fail "tartan add accepted $1 / $2"
    grep -q "$3" "$work/npy.out" || fail "$1 / $2: expected $3, got: $(cat "$work/npy.out")"
    grep -q ENOMEM "$work/npy.out" && fail "$1 / $2: ran out of memory instead of refusing"
    return 0
}
try_add "$work/rows.npy" "$work/lens1.npy" TARTAN_ETRUNC
try_add "$work/dim.npy" "$work/lens1.npy" TARTAN_ETRUNC
try_add "$work/g022/embeddings.npy" "$work/lens.npy" TARTAN_ETRUNC
try_add "$work/hdr.npy" "$work/lens1.npy" TARTAN_EFORMAT
echo "check_limits: huge shapes and headers refused from the header (address-space limit: $vlimit KiB)"
