#!/usr/bin/env bash
# check_crash.sh: kills `tartan add` and `tartan delete` with SIGKILL at random moments and
# checks after each kill that the index opens, passes `tartan check`, and holds exactly the
# batches whose command returned: a killed command's batch is there whole or not at all.
#
# Knobs: TARTAN_CRASH_ROUNDS (default 20; a few seconds), TARTAN_CRASH_DOCS (documents per
# batch, default 300), TARTAN_CRASH_SEED (default: random, printed so that a failure can be
# replayed). Each add and each delete is one command and one transaction (--batch covers the
# whole batch), so "returned" and "committed" are the same thing.
set -u
top_builddir=${top_builddir:-.}
tartan=$top_builddir/tartan
list_ids=$top_builddir/tests/list_ids
rounds=${TARTAN_CRASH_ROUNDS:-20}
docs=${TARTAN_CRASH_DOCS:-300}
seed=${TARTAN_CRASH_SEED:-$(( $(date +%s) % 100000 ))}
nbatch=6
RANDOM=$seed
echo "check_crash: seed $seed, $rounds rounds, $nbatch batches of $docs documents"

work=$(mktemp -d /tmp/tartan-crash-XXXXXX)
trap 'rm -rf "$work"' EXIT
ix=$work/ix
fail() {
    echo "check_crash: FAIL (seed $seed): $*" >&2
    exit 1
}

for i in $(seq 0 $((nbatch - 1))); do
    "$tartan" gen "$work/c$i" --docs "$docs" --dim 64 --doc-len 30 --queries 1 \
        --seed $((seed + i)) >/dev/null || fail "tartan gen"
    seq 0 $((docs - 1)) | sed "s/^/b$i-/" >"$work/c$i/batch.ids"
done
"$tartan" build "$ix" --embeddings "$work/c0/embeddings.npy" --doclens "$work/c0/doclens.npy" \
    --ids "$work/c0/batch.ids" --centroids 256 >/dev/null 2>&1 || fail "tartan build"
present=(1 0 0 0 0 0)

# How many of batch i's ids the index holds, from a sorted id list on stdin.
count_batch() { grep -c "^b$1-" || true; }

verify() {
    "$tartan" check "$ix" >"$work/check.out" 2>&1 ||
        fail "tartan check after round $1: $(head -5 "$work/check.out")"
    "$list_ids" "$ix" >"$work/ids.now" || fail "list_ids after round $1"
    local expect=0
    for i in $(seq 0 $((nbatch - 1))); do
        local n
        n=$(count_batch "$i" <"$work/ids.now")
        if [ "${present[$i]}" = 1 ]; then
            [ "$n" = "$docs" ] || fail "round $1: batch $i should be whole, has $n of $docs ids"
            expect=$((expect + docs))
        else
            [ "$n" = 0 ] || fail "round $1: batch $i should be absent, has $n of $docs ids"
        fi
    done
    local total
    total=$(wc -l <"$work/ids.now")
    [ "$total" = "$expect" ] || fail "round $1: $total ids, expected $expect"
    "$tartan" info "$ix" >"$work/info.out" 2>&1 || fail "tartan info after round $1"
    grep -q "^documents *$expect\$" "$work/info.out" ||
        fail "round $1: tartan info says $(grep '^documents' "$work/info.out"), expected $expect"
}

# Each command's own duration, to spread the kills over it (start-up, training, encoding,
# the transaction, the commit, the exit).
start_ns=$(date +%s%N)
"$tartan" add "$ix" --embeddings "$work/c1/embeddings.npy" --doclens "$work/c1/doclens.npy" \
    --ids "$work/c1/batch.ids" --batch 1000000 >/dev/null 2>&1 || fail "timing add"
add_ms=$(( ($(date +%s%N) - start_ns) / 1000000 + 1 ))
start_ns=$(date +%s%N)
"$tartan" delete "$ix" --ids "$work/c1/batch.ids" >/dev/null 2>&1 || fail "timing delete"
del_ms=$(( ($(date +%s%N) - start_ns) / 1000000 + 1 ))
echo "check_crash: add takes ${add_ms} ms, delete ${del_ms} ms"
verify 0

killed=0 finished=0 landed=0
for r in $(seq 1 "$rounds"); do
    i=$((RANDOM % nbatch))
    if [ "${present[$i]}" = 1 ]; then
        op=delete
        ms=$del_ms
        "$tartan" delete "$ix" --ids "$work/c$i/batch.ids" >/dev/null 2>&1 &
    else
        op=add
        ms=$add_ms
        "$tartan" add "$ix" --embeddings "$work/c$i/embeddings.npy" \
            --doclens "$work/c$i/doclens.npy" --ids "$work/c$i/batch.ids" \
            --batch 1000000 >/dev/null 2>&1 &
    fi
    pid=$!
    # A random moment over 160% of the command's usual run: under load a run takes longer
    # than the quiet one measured above, and some must finish.
    delay=$((RANDOM % (ms * 16 / 10 + 1)))
    sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
    kill -KILL "$pid" 2>/dev/null
    { wait "$pid"; } 2>/dev/null
    status=$?
    if [ "$status" = 0 ]; then
        finished=$((finished + 1))
        [ "$op" = add ] && present[$i]=1 || present[$i]=0
    elif [ "$status" = 137 ]; then
        killed=$((killed + 1))
        # Killed: the batch is whole or absent; whichever it is becomes the expectation.
        "$list_ids" "$ix" >"$work/ids.now" 2>/dev/null || fail "list_ids after the kill in round $r"
        n=$(count_batch "$i" <"$work/ids.now")
        if [ "$op" = add ] && [ "$n" = "$docs" ]; then
            present[$i]=1
            landed=$((landed + 1))
        elif [ "$op" = delete ] && [ "$n" = 0 ]; then
            present[$i]=0
            landed=$((landed + 1))
        fi
    else
        fail "round $r: tartan $op of batch $i exited with $status"
    fi
    verify "$r"
done
echo "check_crash: $rounds rounds: $finished finished, $killed killed ($landed of them had" \
    "committed), index sound and whole after each"
