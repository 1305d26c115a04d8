#!/usr/bin/env bash
# check_compact_crash.sh: kills `tartan compact` and `tartan check --repair` with SIGKILL at
# random moments and checks after each kill that the index opens, passes `tartan check` (or,
# for a repair killed before it landed, reports exactly the damage it had), holds exactly the
# ids it should, and that the next rewrite removes what a killed one left beside it.
#
# Knobs: TARTAN_CRASH_ROUNDS (default 16), TARTAN_CRASH_DOCS (documents per batch, default
# 300), TARTAN_CRASH_SEED (default: random, printed so that a failure can be replayed).
set -u
top_builddir=${top_builddir:-.}
tartan=$top_builddir/tartan
list_ids=$top_builddir/tests/list_ids
flip_doc=$top_builddir/tests/flip_doc
rounds=${TARTAN_CRASH_ROUNDS:-16}
docs=${TARTAN_CRASH_DOCS:-300}
seed=${TARTAN_CRASH_SEED:-$(( $(date +%s) % 100000 ))}
RANDOM=$seed
echo "check_compact_crash: seed $seed, $rounds rounds, batches of $docs documents"

work=$(mktemp -d /tmp/tartan-compact-crash-XXXXXX)
trap 'rm -rf "$work"' EXIT
ix=$work/ix
fail() {
    echo "check_compact_crash: FAIL (seed $seed): $*" >&2
    exit 1
}

for i in 0 1; do
    "$tartan" gen "$work/c$i" --docs "$docs" --dim 64 --doc-len 30 --queries 1 \
        --seed $((seed + i)) >/dev/null || fail "tartan gen"
    seq 0 $((docs - 1)) | sed "s/^/b$i-/" >"$work/c$i/batch.ids"
done
"$tartan" build "$ix" --embeddings "$work/c0/embeddings.npy" --doclens "$work/c0/doclens.npy" \
    --ids "$work/c0/batch.ids" --centroids 256 >/dev/null 2>&1 || fail "tartan build"
"$tartan" add "$ix" --embeddings "$work/c1/embeddings.npy" --doclens "$work/c1/doclens.npy" \
    --ids "$work/c1/batch.ids" >/dev/null 2>&1 || fail "tartan add"
# Holes in the numbers and free pages: every third document of batch 0 deleted.
awk 'NR % 3 == 0' "$work/c0/batch.ids" >"$work/del.ids"
"$tartan" delete "$ix" --ids "$work/del.ids" >/dev/null 2>&1 || fail "tartan delete"
"$list_ids" "$ix" >"$work/expect" || fail "list_ids"

leftovers() { find "$work" -maxdepth 1 -name 'ix.compact-*' | wc -l; }

# Each command's own duration, to spread the kills over it.
start_ns=$(date +%s%N)
"$tartan" compact "$ix" >/dev/null 2>&1 || fail "timing compact"
ms=$(( ($(date +%s%N) - start_ns) / 1000000 + 1 ))
echo "check_compact_crash: a compaction takes ${ms} ms"

killed=0 finished=0 repairs=0
for r in $(seq 1 "$rounds"); do
    op=compact
    victim=
    if [ $((RANDOM % 2)) = 1 ]; then
        # A repair: one document damaged first; the repair removes it.
        op=repair
        victim=$(sed -n "$((RANDOM % $(wc -l <"$work/expect") + 1))p" "$work/expect")
        "$flip_doc" "$ix" "$victim" || fail "flip_doc $victim"
        "$tartan" check "$ix" >"$work/check.out" 2>&1 && fail "round $r: damage went unseen"
        "$tartan" check --repair "$ix" >/dev/null 2>&1 &
    else
        "$tartan" compact "$ix" >/dev/null 2>&1 &
    fi
    pid=$!
    delay=$((RANDOM % (ms * 16 / 10 + 1)))
    sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
    kill -KILL "$pid" 2>/dev/null
    { wait "$pid"; } 2>/dev/null
    status=$?
    if [ "$status" = 137 ]; then
        killed=$((killed + 1))
    elif [ "$status" = 0 ]; then
        finished=$((finished + 1))
    else
        fail "round $r: tartan $op exited with $status"
    fi
    "$list_ids" "$ix" >"$work/ids.now" || fail "round $r: the index does not open after the kill"
    if [ "$op" = repair ]; then
        if grep -qx -- "$victim" "$work/ids.now"; then
            # Not repaired (yet): the damage is there, and nothing else.
            "$tartan" check "$ix" >"$work/check.out" 2>&1 && fail "round $r: damage vanished"
            n=$(grep -c '^checksum:' "$work/check.out")
            [ "$(grep -c '^[a-z][a-z-]*: ' "$work/check.out")" = 1 ] && [ "$n" = 1 ] ||
                fail "round $r: unrepaired index reports $(head -3 "$work/check.out")"
            cmp -s "$work/ids.now" "$work/expect" || fail "round $r: ids changed without a repair"
            "$tartan" check --repair "$ix" >/dev/null 2>&1 || fail "round $r: repair after the kill"
            "$list_ids" "$ix" >"$work/ids.now" || fail "list_ids"
        fi
        grep -vx -- "$victim" "$work/expect" >"$work/expect.new"
        mv "$work/expect.new" "$work/expect"
        repairs=$((repairs + 1))
    fi
    "$tartan" check "$ix" >"$work/check.out" 2>&1 ||
        fail "round $r: tartan check: $(head -5 "$work/check.out")"
    cmp -s "$work/ids.now" "$work/expect" || fail "round $r: the index holds other ids"
done
# What killed rewrites left beside the index goes with the next one.
"$tartan" compact "$ix" >/dev/null 2>&1 || fail "final compact"
[ "$(leftovers)" = 0 ] || fail "$(leftovers) directories left beside the index"
"$tartan" check "$ix" >/dev/null 2>&1 || fail "final check"
echo "check_compact_crash: $rounds rounds: $finished finished, $killed killed, $repairs repairs;" \
    "index sound and whole after each"
