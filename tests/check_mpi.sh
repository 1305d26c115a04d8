#!/usr/bin/env bash
# check_mpi.sh: tartan-mpi under `mpirun -np 3` (oversubscribed, loopback only) against one
# index built with the same model (`tartan model` + `tartan build --model`):
#   - exhaustive search over the 3 shards returns exactly the single index's results (ids, and
#     scores to 1e-5), as a TREC run and as JSON lines;
#   - default (adaptive) search over the shards, each shard calibrated on its own documents,
#     keeps at least as much of the exhaustive top 10 as the single index's default search, on
#     three token families;
#   - routing: every shard holds exactly the ids tartan_shard_of gives it (checked against an
#     independent implementation of the documented hash), after build, add and delete;
#   - a rank killed with SIGKILL in the middle of an add leaves every shard sound and holding
#     whole batches of its documents (a prefix of them in file order), and running the same
#     add again with --replace converges to the intended index;
#   - the ranks train one model together (tartan_train_shared), every shard holding it byte for
#     byte; a NaN in one rank's share of the sample stops every rank, without a hang, and
#     trains no shard;
#   - a job with another number of ranks, and a build over an existing index, are refused.
# Skipped (77) where tartan-mpi was not built (configure found no MPI) or mpirun is missing.
set -u
top_builddir=${top_builddir:-.}
tartan=$top_builddir/tartan
tmpi=$top_builddir/tartan-mpi
list_ids=$top_builddir/tests/list_ids
[ -x "$tmpi" ] || { echo "check_mpi: SKIP: tartan-mpi not built (configure found no MPI)"; exit 77; }
mpirun=${MPIRUN:-$(command -v mpirun || command -v mpiexec || true)}
[ -n "$mpirun" ] || { echo "check_mpi: SKIP: no mpirun"; exit 77; }
command -v python3 >/dev/null || { echo "check_mpi: SKIP: no python3"; exit 77; }

# Open MPI as root, more ranks than cores, loopback only; one thread a rank; the CPU path.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export OMP_NUM_THREADS=1 TARTAN_DEVICE=cpu
P=3

work=$(mktemp -d "${TMPDIR:-/tmp}/tartan-mpi-XXXXXX")
trap 'rm -rf "$work"' EXIT
# Under LeakSanitizer (.ci/sanitizers): Open MPI does not free its own allocations when a
# process ends; its components stay loaded and stacks are unwound in full (so that its frames
# can be named: the fast unwinder stops inside them), and its libraries' leaks are
# suppressed. Leaks of tartan's own code still fail.
export OMPI_MCA_mca_base_component_disable_dlclose=1
[ -z "${ASAN_OPTIONS+x}" ] || export ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0"
printf 'leak:%s\n' libmpi.so libopen-pal.so libopen-rte.so libhwloc.so libpmix.so libevent \
    mca_ libucp libucs libfabric >"$work/lsan.supp"
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$work/lsan.supp:print_suppressions=0"
failures=0
fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}
ok() { echo "ok: $*"; }
die() {
    echo "check_mpi: FAIL: $*"
    exit 1
}
mpi() { "$mpirun" -np "$P" "$tmpi" "$@"; }

ix=$work/ix
one=$work/one

# ---- corpora: the base, a later add, and an add that a kill interrupts --------------------
gen() { # gen DIR DOCS SEED PREFIX
    "$tartan" gen "$1" --docs "$2" --queries 25 --doc-len 30 --seed "$3" >/dev/null 2>&1 ||
        die "tartan gen $1"
    seq 0 $(($2 - 1)) | sed "s/^/$4/" >"$1/ids.txt"
}
gen "$work/a" 900 11 a-
gen "$work/b" 300 12 b-
gen "$work/c" 1200 13 c-
A=(--embeddings "$work/a/embeddings.npy" --doclens "$work/a/doclens.npy" --ids "$work/a/ids.txt")
B=(--embeddings "$work/b/embeddings.npy" --doclens "$work/b/doclens.npy" --ids "$work/b/ids.txt")
C=(--embeddings "$work/c/embeddings.npy" --doclens "$work/c/doclens.npy" --ids "$work/c/ids.txt")
Q=(--queries "$work/a/queries.npy" -q)

# ---- helpers -------------------------------------------------------------------------------
# The documented routing (engine/tartan.h, tartan_shard_of), written again from its description.
cat >"$work/shard_of.py" <<'EOF'
def shard(i, n):
    h = 0xcbf29ce484222325
    for c in i.encode():
        h = ((h ^ c) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    b, j = -1, 0
    while j < n:
        b = j
        h = (h * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        j = int((b + 1) * (float(1 << 31) / float((h >> 33) + 1)))
    return b
EOF
# routed: every shard holds exactly the ids of $work/expect.ids that the documented hash
# (FNV-1a 64, jump consistent hash; engine/tartan.h) sends to it.
routed() {
    for r in $(seq 0 $((P - 1))); do
        "$list_ids" "$ix/shard-$r-of-$P" >"$work/shard$r.ids" || return 1
    done
    python3 - "$P" "$work" <<'EOF'
import sys
P, work = int(sys.argv[1]), sys.argv[2]
exec(open(f"{work}/shard_of.py").read())
want = set(open(f"{work}/expect.ids").read().split())
seen = set()
for r in range(P):
    ids = open(f"{work}/shard{r}.ids").read().split()
    bad = [i for i in ids if shard(i, P) != r]
    if bad:
        sys.exit(f"shard {r} holds {len(bad)} ids of other shards, e.g. {bad[0]}")
    seen |= set(ids)
if seen != want:
    sys.exit(f"{len(want - seen)} ids missing, {len(seen - want)} extra")
EOF
}

# same_run A B: the same ids in the same order per query, scores within 1e-5.
same_run() {
    python3 - "$1" "$2" <<'EOF'
import sys
def read(p):
    return [l.split() for l in open(p)]
a, b = read(sys.argv[1]), read(sys.argv[2])
if len(a) != len(b):
    sys.exit(f"{len(a)} lines against {len(b)}")
for x, y in zip(a, b):
    if x[0] != y[0] or x[2] != y[2] or x[3] != y[3] or abs(float(x[4]) - float(y[4])) > 1e-5:
        sys.exit(f"{' '.join(x)}  <>  {' '.join(y)}")
EOF
}

# recall RUN EXH: share of EXH's (query, doc) pairs that RUN has.
recall() {
    python3 - "$1" "$2" <<'EOF'
import sys
run = {(l.split()[0], l.split()[2]) for l in open(sys.argv[1])}
exh = [(l.split()[0], l.split()[2]) for l in open(sys.argv[2])]
print(f"{sum(p in run for p in exh) / len(exh):.6f}")
EOF
}

compare_exhaustive() { # compare_exhaustive WHAT
    mpi search "$ix" "${Q[@]}" --exhaustive -k 10 -o "$work/sh.run" &&
        "$tartan" search "$one" "${Q[@]}" --exhaustive -k 10 -o "$work/one.run" ||
        { fail "$1: a search failed"; return; }
    if msg=$(same_run "$work/sh.run" "$work/one.run"); then
        ok "$1: exhaustive over $P shards = the single index"
    else
        fail "$1: exhaustive over shards differs from the single index: $msg"
    fi
}

# ---- build -----------------------------------------------------------------------------------
mpi build "$ix" "${A[@]}" --batch 40 2>"$work/build.err" || die "build: $(cat "$work/build.err")"
grep -q "built .* over 3 shards: 900 documents" "$work/build.err" && ok "build over 3 ranks" ||
    fail "build summary: $(cat "$work/build.err")"
mpi check "$ix" >"$work/check.out" 2>&1 && grep -q "sound (3 shards, 900 documents" "$work/check.out" &&
    ok "check after build" || fail "check after build: $(cat "$work/check.out")"
mpi info "$ix" >"$work/info.out" 2>&1 && grep -q "^model .*one for all shards" "$work/info.out" &&
    grep -q "^total .* 900 " "$work/info.out" && ok "info: 900 documents, one model" ||
    fail "info: $(cat "$work/info.out")"
# Every shard calibrated its own search after the build (tools/mpi_ingest.c says why).
grep -q "calibrated the search of 3 shards" "$work/build.err" &&
    [ "$(grep -c "shard [0-2]: recall@10 [0-9.]*, probe margin" "$work/info.out")" = 3 ] &&
    ok "build calibrates every shard's search" ||
    fail "calibration after build: $(cat "$work/build.err" "$work/info.out")"
cp "$work/a/ids.txt" "$work/expect.ids"
msg=$(routed) && ok "build routes every id to its shard" || fail "build routing: $msg"

# The shards trained together (tartan_train_shared), and said where the time went.
grep -q "trained one model over 3 ranks from 900 sampled documents (.*): sampling .* k-means .* codec .* exchanges" "$work/build.err" &&
    ok "the ranks trained one model together (time breakdown printed)" ||
    fail "no shared training summary: $(cat "$work/build.err")"

# The single index with the same model.
"$tartan" model "$ix/shard-0-of-$P" -o "$work/model.bin" || die "tartan model"
for r in 1 2; do
    "$tartan" model "$ix/shard-$r-of-$P" -o "$work/model$r.bin" || die "tartan model $r"
    cmp -s "$work/model.bin" "$work/model$r.bin" && ok "shard $r has shard 0's model" ||
        fail "shard $r's model differs"
done
"$tartan" build "$one" "${A[@]}" --model "$work/model.bin" 2>/dev/null || die "build --model"
# A sample of every document: `tartan build` trains on the file's rows in place
# (tools/ingest.c), one rank of tartan-mpi on its own copy of them: the same model.
"$mpirun" -np 1 "$tmpi" build "$work/solo" "${A[@]}" --no-calibrate 2>/dev/null &&
    "$tartan" build "$work/self" "${A[@]}" --no-calibrate 2>/dev/null &&
    "$tartan" model "$work/solo/shard-0-of-1" -o "$work/solo.model" &&
    "$tartan" model "$work/self" -o "$work/self.model" &&
    cmp -s "$work/solo.model" "$work/self.model" &&
    ok "a whole-corpus sample read in place trains the model a copied one does" ||
    fail "whole-corpus sample: the models of tartan build and one rank differ"

# ---- search ----------------------------------------------------------------------------------
compare_exhaustive "after build"
mpi search "$ix" "${Q[@]}" --exhaustive -k 10 --format jsonl -o "$work/sh.jsonl" &&
    "$tartan" search "$one" "${Q[@]}" --exhaustive -k 10 --format jsonl -o "$work/one.jsonl" &&
    python3 - "$work/sh.jsonl" "$work/one.jsonl" <<'EOF' && ok "JSON lines: the same hits" || fail "JSON lines differ"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert [x["qid"] for x in a] == [x["qid"] for x in b]
for x, y in zip(a, b):
    assert [h["id"] for h in x["hits"]] == [h["id"] for h in y["hits"]]
    assert all(abs(h["score"] - g["score"]) <= 1e-5 for h, g in zip(x["hits"], y["hits"]))
EOF
# Default search: recall against exhaustive no lower than the single index's.
mpi search "$ix" "${Q[@]}" -k 10 -o "$work/sh_def.run" &&
    "$tartan" search "$one" "${Q[@]}" -k 10 -o "$work/one_def.run" || fail "default searches"
r_sh=$(recall "$work/sh_def.run" "$work/one.run")
r_one=$(recall "$work/one_def.run" "$work/one.run")
python3 -c "import sys; sys.exit(0 if $r_sh >= $r_one else 1)" &&
    ok "default search recall@10: shards $r_sh >= single $r_one" ||
    fail "default search recall@10: shards $r_sh < single $r_one"
# The same on two other token families (tartan gen --model 1 and 3), each its own sharded
# index and single index with the same model; model 3's with the axes code (--codec axes:
# fitted on rank 0, broadcast in its stored form, carried by the model to the single index).
for fam in 1 3; do
    CODEC=()
    [ "$fam" = 3 ] && CODEC=(--codec axes)
    "$tartan" gen "$work/m$fam" --docs 600 --queries 25 --doc-len 30 --seed $((20 + fam)) \
        --model "$fam" >/dev/null 2>&1 || die "tartan gen --model $fam"
    F=(--embeddings "$work/m$fam/embeddings.npy" --doclens "$work/m$fam/doclens.npy")
    FQ=(--queries "$work/m$fam/queries.npy" -q -k 10)
    mpi build "$work/ixm$fam" "${F[@]}" "${CODEC[@]}" 2>/dev/null &&
        "$tartan" model "$work/ixm$fam/shard-0-of-$P" -o "$work/m$fam.model" &&
        "$tartan" build "$work/onem$fam" "${F[@]}" --model "$work/m$fam.model" 2>/dev/null &&
        mpi search "$work/ixm$fam" "${FQ[@]}" -o "$work/m$fam-sh.run" &&
        mpi search "$work/ixm$fam" "${FQ[@]}" --exhaustive -o "$work/m$fam-sh-exh.run" &&
        "$tartan" search "$work/onem$fam" "${FQ[@]}" -o "$work/m$fam-one.run" &&
        "$tartan" search "$work/onem$fam" "${FQ[@]}" --exhaustive -o "$work/m$fam-one-exh.run" ||
        { fail "model $fam: a build or search failed"; continue; }
    if [ "$fam" = 3 ]; then
        same=1
        for r in $(seq 1 $((P - 1))); do
            "$tartan" model "$work/ixm$fam/shard-$r-of-$P" -o "$work/m$fam-$r.model" &&
                cmp -s "$work/m$fam.model" "$work/m$fam-$r.model" || same=0
        done
        [ $same = 1 ] && ok "model 3, axes code: every shard has shard 0's model" ||
            fail "model 3, axes code: a shard's model differs"
    fi
    msg=$(same_run "$work/m$fam-sh-exh.run" "$work/m$fam-one-exh.run") &&
        ok "model $fam: exhaustive over shards = the single index" ||
        fail "model $fam: exhaustive differs: $msg"
    r_sh=$(recall "$work/m$fam-sh.run" "$work/m$fam-one-exh.run")
    r_one=$(recall "$work/m$fam-one.run" "$work/m$fam-one-exh.run")
    python3 -c "import sys; sys.exit(0 if $r_sh >= $r_one else 1)" &&
        ok "model $fam: default search recall@10: shards $r_sh >= single $r_one" ||
        fail "model $fam: default search recall@10: shards $r_sh < single $r_one"
done
# A subset: only its documents come back, the same as the single index's.
head -300 "$work/a/ids.txt" >"$work/subset.txt"
mpi search "$ix" "${Q[@]}" -k 5 --subset "$work/subset.txt" --exhaustive -o "$work/sh_sub.run" &&
    "$tartan" search "$one" "${Q[@]}" -k 5 --subset "$work/subset.txt" --exhaustive -o "$work/one_sub.run" &&
    same_run "$work/sh_sub.run" "$work/one_sub.run" && ok "subset search" || fail "subset search"

# ---- add and delete -------------------------------------------------------------------------
mpi add "$ix" "${B[@]}" --batch 20 2>"$work/add.err" && grep -q "added 300 documents" "$work/add.err" &&
    ok "add 300 documents" || fail "add: $(cat "$work/add.err")"
"$tartan" add "$one" "${B[@]}" 2>/dev/null || die "single add"
cat "$work/a/ids.txt" "$work/b/ids.txt" >"$work/expect.ids"
msg=$(routed) && ok "add routes every id to its shard" || fail "add routing: $msg"
compare_exhaustive "after add"
# Adding an id the index has, without --replace: refused by the shard that holds it.
mpi add "$ix" "${B[@]}" 2>"$work/dup.err" && fail "a second add of the same ids succeeded" ||
    { grep -q "TARTAN_EDUPID" "$work/dup.err" && ok "a second add is refused (TARTAN_EDUPID)" ||
        fail "second add: $(cat "$work/dup.err")"; }

{ sed -n '1~7p' "$work/a/ids.txt"; sed -n '1~5p' "$work/b/ids.txt"; echo no-such-id; } >"$work/del.txt"
n_del=$(($(wc -l <"$work/del.txt") - 1))
mpi delete "$ix" --ids "$work/del.txt" 2>"$work/del.err" &&
    grep -q "deleted $n_del documents (1 ids not in the index)" "$work/del.err" &&
    ok "delete $n_del documents" || fail "delete: $(cat "$work/del.err")"
"$tartan" delete "$one" --ids "$work/del.txt" 2>/dev/null || die "single delete"
grep -vxF -f "$work/del.txt" "$work/expect.ids" >"$work/expect2.ids"
mv "$work/expect2.ids" "$work/expect.ids"
msg=$(routed) && ok "delete leaves exactly the other ids" || fail "delete routing: $msg"
compare_exhaustive "after delete"
# Deleting again changes nothing (idempotent).
mpi delete "$ix" --ids "$work/del.txt" 2>"$work/del2.err" &&
    grep -q "deleted 0 documents" "$work/del2.err" && ok "a second delete deletes nothing" ||
    fail "second delete: $(cat "$work/del2.err")"

# ---- a rank killed in the middle of an add --------------------------------------------------
# Batches of 2 documents: many transactions per shard. Rank 1 is killed once its shard holds
# at least one batch of c's documents, while the add goes on.
count_c() { "$list_ids" "$1" | grep -c '^c-' || true; }
# The processes whose parent is $1 (from /proc: no procps needed). One awk over every stat
# line: an awk a process took a second on a loaded machine, time in which rank 1 could finish
# its whole share before it was found (CI saw that once). A stat line is "pid (comm) state
# ppid ..." and comm may hold spaces; a process gone since the glob only makes cat complain.
children() {
    cat /proc/[0-9]*/stat 2>/dev/null |
        awk -v p="$1" '{ pid = $1; sub(/^.*\) /, ""); if ($2 == p) print pid }' || true
}
"$mpirun" -np "$P" "$tmpi" add "$ix" "${C[@]}" --batch 2 >"$work/kill.out" 2>&1 &
mpid=$!
victim=
# Rank 1 is stopped as soon as it is found and then runs in slices of 20 ms, looked at only
# while stopped: the kill lands wherever a slice ended (inside a transaction or between two),
# and however loaded the machine, rank 1 cannot finish its share between two looks.
for _ in $(seq 1 3000); do
    if [ -z "$victim" ]; then
        for c in $(children "$mpid"); do
            tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 &&
                victim=$c && kill -STOP "$victim"
        done
    fi
    if [ -n "$victim" ]; then
        if [ "$(count_c "$ix/shard-1-of-$P" 2>/dev/null)" -ge 2 ] 2>/dev/null; then
            kill -KILL "$victim"
            break
        fi
        kill -CONT "$victim" 2>/dev/null
        sleep 0.02
        kill -STOP "$victim" 2>/dev/null
    else
        sleep 0.02
    fi
    kill -0 "$mpid" 2>/dev/null || break
done
[ -z "$victim" ] || kill -CONT "$victim" 2>/dev/null # never left stopped
wait "$mpid"
st=$?
[ -n "$victim" ] || die "never found rank 1 of the add (mpirun $mpid)"
[ "$st" -ne 0 ] && ok "the add with a killed rank failed (mpirun exit $st)" ||
    fail "the add with a killed rank exited 0"
# Every shard sound; each holds whole batches of its own documents, a prefix of them in file
# order; shard 1 (killed) holds less than all of its share.
mpi check "$ix" >"$work/check2.out" 2>&1 && ok "check after the kill: every shard sound" ||
    fail "check after the kill: $(cat "$work/check2.out")"
for r in $(seq 0 $((P - 1))); do
    "$list_ids" "$ix/shard-$r-of-$P" | grep '^c-' >"$work/kill$r.ids"
done
python3 - "$P" "$work" <<'EOF' && ok "after the kill each shard holds whole batches, a prefix of its documents" || fail "shards after the kill hold partial batches or a non-prefix"
import sys
P, work = int(sys.argv[1]), sys.argv[2]
exec(open(f"{work}/shard_of.py").read())
order = open(f"{work}/c/ids.txt").read().split()
for r in range(P):
    mine = [i for i in order if shard(i, P) == r]
    have = set(open(f"{work}/kill{r}.ids").read().split())
    m = len(have)
    assert have == set(mine[:m]), f"shard {r}: not a prefix of its documents"
    assert m % 2 == 0 or m == len(mine), f"shard {r}: {m} documents, not whole batches of 2"
    if r == 1:
        assert m < len(mine), "shard 1 finished before the kill: nothing was tested"
    print(f"shard {r}: {m} of {len(mine)} of the interrupted add's documents")
EOF
# Recovery: the same add with --replace converges.
mpi add "$ix" "${C[@]}" --batch 2 --replace 2>"$work/redo.err" && ok "the add again with --replace" ||
    fail "the add again: $(cat "$work/redo.err")"
"$tartan" add "$one" "${C[@]}" 2>/dev/null || die "single add of c"
cat "$work/c/ids.txt" >>"$work/expect.ids"
msg=$(routed) && ok "after recovery every id is in its shard, once" || fail "after recovery: $msg"
mpi check "$ix" >"$work/check3.out" 2>&1 && ok "check after recovery" ||
    fail "check after recovery: $(cat "$work/check3.out")"
compare_exhaustive "after the kill and the recovery"

# ---- replicas: 6 ranks on the 3 shards, each pair sharing every batch's queries --------------
for args in "--exhaustive -k 10 --batch 5" "-k 10 --batch 7" "-k 3 --batch 1"; do
    # shellcheck disable=SC2086
    mpi search "$ix" "${Q[@]}" $args -o "$work/rep3.run" &&
        # shellcheck disable=SC2086
        "$mpirun" -np 6 "$tmpi" search "$ix" "${Q[@]}" $args -o "$work/rep6.run" 2>"$work/rep6.err" ||
        { fail "replicas ($args): a search failed: $(head -3 "$work/rep6.err")"; continue; }
    if cmp -s "$work/rep3.run" "$work/rep6.run" && [ -s "$work/rep3.run" ]; then
        ok "6 ranks on 3 shards (replicas, $args): the 3 ranks' run"
    else
        fail "6 ranks on 3 shards ($args): another run than 3 ranks'"
    fi
    # Two batches in flight (as on a GPU): rank 0's two threads take turns at MPI, the other
    # ranks search on two threads each; the same run, shards or replicas.
    for np in 3 6; do
        # shellcheck disable=SC2086
        TARTAN_SEARCH_INFLIGHT=2 "$mpirun" -np $np "$tmpi" search "$ix" "${Q[@]}" $args \
            -o "$work/two$np.run" 2>"$work/two$np.err" ||
            { fail "two in flight, $np ranks ($args): $(head -3 "$work/two$np.err")"; continue; }
        cmp -s "$work/rep3.run" "$work/two$np.run" &&
            ok "two batches in flight, $np ranks ($args): the same run" ||
            fail "two batches in flight, $np ranks ($args): another run"
    done
done
"$mpirun" -np 4 "$tmpi" search "$ix" "${Q[@]}" >/dev/null 2>"$work/np4.err" &&
    fail "a 4-rank search of a 3-shard index succeeded" ||
    { grep -q "holds the shards of 3 ranks, not 4" "$work/np4.err" &&
        ok "4 ranks on a 3-shard index: refused, saying why" || fail "np 4: $(head -3 "$work/np4.err")"; }

# ---- a rank whose share of the training sample is bad ---------------------------------------
# A NaN in the first document of rank 1's shard (every document is sampled at this size): rank
# 1's training fails with TARTAN_ENONFINITE, the others learn of it at the next exchange and
# fail too (TARTAN_EGROUP, quiet), the job ends nonzero without hanging, no shard is trained.
mkdir -p "$work/nan"
cp "$work/b/doclens.npy" "$work/b/ids.txt" "$work/nan/"
python3 - "$work/b" "$work/nan" "$P" "$work" <<'EOF' || die "writing the NaN corpus"
import re, struct, sys
src, dst, P, work = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
exec(open(f"{work}/shard_of.py").read())
def npy(path):
    b = bytearray(open(path, "rb").read())
    hl, at = (struct.unpack("<H", b[8:10])[0], 10) if b[6] == 1 else (struct.unpack("<I", b[8:12])[0], 12)
    return b, at + hl, b[at:at + hl].decode("latin1")
lb, loff, lh = npy(f"{src}/doclens.npy")
dt = {"<i4": "i", "<i8": "q"}[re.search(r"'descr': '([^']+)'", lh).group(1)]
lens = struct.unpack(f"<{(len(lb) - loff) // struct.calcsize(dt)}{dt}", bytes(lb[loff:]))
ids = open(f"{src}/ids.txt").read().split()
row = 0
for i, l in enumerate(lens):
    if shard(ids[i], P) == 1:
        break
    row += l
eb, eoff, eh = npy(f"{src}/embeddings.npy")
descr = re.search(r"'descr': '([^']+)'", eh).group(1)
dim = int(re.search(r"'shape': \(\d+, (\d+)\)", eh).group(1))
size, nan = {"<f4": (4, struct.pack("<f", float("nan"))), "<f2": (2, b"\x00\x7e")}[descr]
at = eoff + (row * dim + 3) * size
eb[at:at + size] = nan
open(f"{dst}/embeddings.npy", "wb").write(bytes(eb))
EOF
NAN=(--embeddings "$work/nan/embeddings.npy" --doclens "$work/nan/doclens.npy" --ids "$work/nan/ids.txt")
timeout 300 "$mpirun" -np "$P" "$tmpi" build "$work/ixnan" "${NAN[@]}" >/dev/null 2>"$work/nan.err"
st=$?
if [ "$st" = 124 ]; then
    fail "a bad sample on rank 1: the build hung"
elif [ "$st" -ne 0 ] && grep -q "rank 1: TARTAN_ENONFINITE" "$work/nan.err" &&
    ! grep -q "TARTAN_EGROUP" "$work/nan.err"; then
    ok "a bad sample on rank 1: every rank stopped, rank 1 said why"
else
    fail "a bad sample on rank 1 (exit $st): $(head -5 "$work/nan.err")"
fi
untrained=0
for r in $(seq 0 $((P - 1))); do
    "$tartan" model "$work/ixnan/shard-$r-of-$P" -o "$work/nan$r.bin" 2>/dev/null ||
        untrained=$((untrained + 1))
done
[ "$untrained" = "$P" ] && ok "a bad sample on rank 1: no shard trained" ||
    fail "a bad sample on rank 1: $((P - untrained)) shards trained"

# ---- refusals --------------------------------------------------------------------------------
"$mpirun" -np 2 "$tmpi" search "$ix" "${Q[@]}" >/dev/null 2>"$work/np2.err" &&
    fail "a 2-rank search of a 3-shard index succeeded" ||
    { grep -q "holds the shards of 3 ranks, not 2" "$work/np2.err" &&
        ok "2 ranks on a 3-shard index: refused, saying why" || fail "np 2: $(head -3 "$work/np2.err")"; }
mpi build "$ix" "${A[@]}" 2>"$work/again.err" && fail "a build over an index succeeded" ||
    { grep -q "TARTAN_EEXIST" "$work/again.err" && ok "build over an existing index refused" ||
        fail "build again: $(head -3 "$work/again.err")"; }

echo "check_mpi: $failures failure(s)"
[ "$failures" -eq 0 ]
