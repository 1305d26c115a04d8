#!/usr/bin/env bash
# check_eval_parity.sh: `tartan eval` against trec_eval itself, through pytrec_eval (PyPI
# pytrec-eval-terrier or pytrec_eval, which embed trec_eval's C code). Random qrels and runs
# with graded and negative relevance, tied scores, unjudged documents, queries with no
# relevant document, queries only in the run or only in the qrels, both qrels formats and
# CRLF line ends; every measure of every query, and the means, must agree to 4 decimals.
# Exits 77 (skipped) where pytrec_eval cannot be imported.
set -euo pipefail
top_builddir=${top_builddir:-.}
tartan="$top_builddir/tartan"
python3 -c 'import pytrec_eval' 2>/dev/null || {
    echo "pytrec_eval not importable: skipped (pip install pytrec-eval-terrier)"
    exit 77
}
[ -x "$tartan" ] || { echo "no $tartan: build it first"; exit 1; }
# BEIR SciFact's real qrels (CRLF, header line), where shared/ sits beside the checkout.
top_srcdir=${top_srcdir:-.}
scifact=
for d in "${TARTAN_SCIFACT:-}" "$top_srcdir/../shared/data/beir/scifact" \
         "$top_srcdir/../../shared/data/beir/scifact"; do
    [ -n "$d" ] && [ -f "$d/qrels/test.tsv" ] && { scifact=$d; break; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/tartan-parity-XXXXXX")
trap 'rm -rf "$work"' EXIT

python3 - "$tartan" "$work" "$scifact" <<'PY'
import json, os, random, subprocess, sys
import pytrec_eval

tartan, work, scifact = sys.argv[1], sys.argv[2], sys.argv[3]
seed = int(os.environ.get("TARTAN_TEST_SEED", random.randrange(1 << 30)))
print(f"seed {seed}")
rng = random.Random(seed)

cut_measures = {"ndcg_cut": [1, 3, 5, 10, 100], "recall": [1, 5, 10, 100],
                "P": [1, 5, 10, 20], "map_cut": [5, 10, 100]}
ours = ",".join(f"{m}.{','.join(map(str, ks))}" for m, ks in cut_measures.items())
ours += ",map,recip_rank,ndcg,recip_rank.1,recip_rank.3,recip_rank.10"
theirs = {"map", "recip_rank", "ndcg"} | {f"{m}.{','.join(map(str, ks))}"
                                          for m, ks in cut_measures.items()}

def docid():
    # Shared prefixes and varied lengths make byte-order tie-breaking matter.
    return rng.choice(["d", "D", "doc", "d1", "x"]) + str(rng.randrange(60))

def random_case(trial):
    qrels, run = {}, {}
    nq = rng.randrange(3, 25)
    for q in range(nq):
        qid = f"q{rng.randrange(40)}"
        if rng.random() < 0.85:  # judged
            docs = {docid() for _ in range(rng.randrange(1, 30))}
            qrels[qid] = {d: rng.choice([-1, 0, 0, 1, 1, 2, 3]) for d in docs}
            if rng.random() < 0.15:  # judged, nothing relevant
                qrels[qid] = {d: 0 for d in docs}
        if rng.random() < 0.85:  # retrieved
            docs = {docid() for _ in range(rng.randrange(1, 120))}
            scale = rng.choice([1, 10, 0.001])
            # Few distinct scores: many ties.
            run[qid] = {d: round(rng.choice([-1, 1]) * rng.randrange(8) * scale, 6)
                        for d in docs}
    return qrels, run

def scifact_case():
    # The real judgments, and a run over real corpus ids that finds some relevant documents.
    qrels = {}
    with open(f"{scifact}/qrels/test.tsv", newline="") as f:
        next(f)
        for line in f:
            q, d, r = line.rstrip("\r\n").split("\t")
            qrels.setdefault(q, {})[d] = int(r)
    ids = [json.loads(l)["_id"] for l in open(f"{scifact}/corpus.jsonl")]
    run = {}
    for q, ds in qrels.items():
        docs = set(rng.sample(ids, 100)) | {d for d in ds if rng.random() < 0.6}
        run[q] = {d: rng.randrange(200) / 8 for d in docs}
    return qrels, run

REF_SECONDS = 20

def reference(qrels, run, level):
    """pytrec_eval's results, computed in a child process: on rare random inputs its C code
    never returns, and a hung reference must not hang the test suite. None on a time-out."""
    import multiprocessing as mp, queue
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    def work():
        ev = pytrec_eval.RelevanceEvaluator(qrels, theirs, relevance_level=level)
        out.put(ev.evaluate(run))
    child = ctx.Process(target=work)
    child.start()
    try:
        res = out.get(timeout=REF_SECONDS)
    except queue.Empty:
        res = None
        child.kill()
    child.join()
    return res

failures = 0
hung = 0
for trial in range(13 if scifact else 12):
    level = 1 if trial % 3 else 2
    qrels, run = scifact_case() if trial == 12 else random_case(trial)
    if trial == 12:
        level = 1
        print(f"trial 12: BEIR SciFact test qrels from {scifact}")
    crlf = "\r\n" if trial % 2 else "\n"
    qpath, rpath = f"{work}/qrels{trial}", f"{work}/run{trial}"
    if trial == 12:
        qpath = f"{scifact}/qrels/test.tsv"  # the file itself, CRLF and all
    else:
        with open(qpath, "w", newline="") as f:
            if trial % 4 < 2:
                f.write("query-id\tcorpus-id\tscore" + crlf)
                for q, ds in qrels.items():
                    for d, r in ds.items():
                        f.write(f"{q}\t{d}\t{r}{crlf}")
            else:
                for q, ds in qrels.items():
                    for d, r in ds.items():
                        f.write(f"{q} 0 {d} {r}{crlf}")
    with open(rpath, "w", newline="") as f:
        for q, ds in run.items():
            items = list(ds.items())
            rng.shuffle(items)  # the rank column must not matter
            for i, (d, s) in enumerate(items):
                f.write(f"{q} Q0 {d} {i + 1} {s!r} tag{crlf}")
    for complete in (False, True):
        jpath = f"{work}/out{trial}.json"
        cmd = [tartan, "eval", "--qrels", qpath, "--run", rpath, "--metrics", ours,
               "--per-query", "--json", jpath, "--level", str(level)]
        if complete:
            cmd.append("--complete")
        # Rare draws with nothing to evaluate: no judged query at all, or (without --complete)
        # no query both judged and retrieved. The tool stops with an error saying which
        # (trec_eval's reference would be empty), not an empty table.
        nothing = ("no judgments" if not qrels else
                   "no query has both results and judgments"
                   if not complete and not set(qrels) & set(run) else None)
        if nothing:
            p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if p.returncode == 0 or nothing not in p.stderr:
                print(f"trial {trial}: expected '{nothing}': exit {p.returncode}, "
                      f"{p.stderr.strip()!r}")
                failures += 1
            continue
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        got = json.load(open(jpath))
        want = reference(qrels, run, level)
        if want is None:
            print(f"trial {trial}: pytrec_eval did not finish in {REF_SECONDS} s; trial skipped "
                  f"(a hang inside the reference, seen on rare random inputs: rerun with "
                  f"TARTAN_TEST_SEED={seed} to reproduce)")
            hung += 1
            break
        # MRR@k, which trec_eval lacks, is recip_rank where the first relevant is in the top k.
        for q in want.values():
            for k in (1, 3, 10):
                rr = q["recip_rank"]
                q[f"recip_rank_{k}"] = rr if rr > 0 and 1 / rr <= k + 1e-9 else 0.0
        if set(got["per_query"]) != set(want):
            print(f"trial {trial}: queries differ: {sorted(got['per_query'])} vs {sorted(want)}")
            failures += 1
            continue
        names = list(got["measures"])
        for q, vals in want.items():
            for m in names:
                if abs(got["per_query"][q][m] - vals[m]) > 5e-5:
                    print(f"trial {trial} query {q} {m}: tartan {got['per_query'][q][m]} "
                          f"trec_eval {vals[m]}")
                    failures += 1
        denom = len(qrels) if complete else len(want)
        if got["num_q"] != denom:
            print(f"trial {trial}: num_q {got['num_q']} vs {denom}")
            failures += 1
        for m in names:
            mean = sum(v[m] for v in want.values()) / denom
            if abs(got["measures"][m] - mean) > 5e-5:
                print(f"trial {trial} mean {m}: tartan {got['measures'][m]} trec_eval {mean}")
                failures += 1
print("parity failures:", failures, "| trials the reference hung on:", hung)
sys.exit(1 if failures else 0)
PY
