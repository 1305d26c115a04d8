#!/usr/bin/env python3
"""Table and plots of a bench/peers_run.sh output directory (issue 22).

    python3 bench/peers_plot.py OUTDIR [--md peers-table.md]

Reads every OUTDIR/*/*.jsonl (bench/peers_common.py's records) and writes, per corpus:
- a markdown table (OUTDIR/peers-table.md, every corpus in one file): the builds (seconds,
  bytes a token, where), every search setting (recall@10 against exact MaxSim and against
  tartan's exhaustive search, batched queries/s, queries/s per core, p50/p99 latency of one
  query a call), and "at equal recall": each engine's best queries/s per core among its
  settings reaching each recall level, and tartan's ratio to the best peer;
- a plot OUTDIR/peers-CORPUS.png: recall@10 against exact MaxSim (x) by queries/s per core
  (y, log), one colour an engine, one marker a thread count, GPU runs in a second panel
  (queries/s). Without matplotlib the table is still written.
"""
import argparse
import glob
import json
import math
import os
import sys

ENGINE_ORDER = ["tartan", "tartan-nb4", "warp", "fast-plaid", "voyager"]
COLOURS = {"tartan": "#1f77b4", "tartan-nb4": "#17becf", "warp": "#d62728",
           "fast-plaid": "#2ca02c", "voyager": "#9467bd"}
MARKERS = {1: "o", 2: "D", 4: "s", 16: "^"}
LEVELS = [0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99]


def load(outdir):
    recs = []
    for p in sorted(glob.glob(os.path.join(outdir, "*", "*.jsonl"))):
        with open(p) as f:
            for ln in f:
                ln = ln.strip()
                if ln:
                    try:
                        recs.append(json.loads(ln))
                    except json.JSONDecodeError:
                        print(f"{p}: a line that is not JSON, left out", file=sys.stderr)
    return recs


def fmt(x, nd=1):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return str(x)


def params_str(p):
    if not p:
        return ""
    keep = {k: v for k, v in p.items() if v is not None and k not in ("dtype",)}
    return ", ".join(f"{k} {v}" for k, v in keep.items())


def eng_key(e):
    return ENGINE_ORDER.index(e) if e in ENGINE_ORDER else len(ENGINE_ORDER)


def load_str(r):
    """The 1-minute load average when the record was written."""
    ld = (r.get("machine") or {}).get("load")
    return f"{ld[0]:.1f}" if ld else ""


def kind_of(r):
    return r.get("device_kind") or ("cpu" if r.get("device") == "cpu" else "gpu")


def table(corpus, recs):
    out = []
    builds = [r for r in recs if r.get("kind") == "build"]
    searches = [r for r in recs if r.get("kind") == "search"]
    errors = [r for r in recs if r.get("kind") == "error"]
    any_r = (builds or searches)[0]
    out.append(f"### {corpus}: {any_r['documents']:,} documents, {any_r['tokens']:,} tokens\n")
    m = any_r.get("machine", {})
    out.append(f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores; "
               f"GPU: {next((r['device'] for r in recs if kind_of(r) == 'gpu'), 'none')}; "
               f"commit {m.get('commit')}; {min(r['date'] for r in recs)} to "
               f"{max(r['date'] for r in recs)}.\n")
    if builds:
        out.append("| engine | version | build s | where (threads) | load | index bytes | "
                   "bytes/token | build settings |")
        out.append("|---|---|---|---|---|---|---|---|")
        for r in sorted(builds, key=lambda r: eng_key(r["engine"])):
            sb = r.get("search_bytes_per_token")
            extra = f"; files search reads: {sb:.1f} B/token" if sb else ""
            out.append(f"| {r['engine']} | {r.get('version')} | {fmt(r['build_s'], 2)} | "
                       f"{r['device']} ({r.get('threads')}) | {load_str(r)} | "
                       f"{r['index_bytes']:,} | {fmt(r['bytes_per_token'], 1)} | "
                       f"{params_str(r.get('params'))}{extra} |")
        out.append("")
    nq = sorted({r.get("nq") for r in searches})
    out.append(f"Searches: k 10, {'/'.join(str(x) for x in nq)} queries a batch (best of the "
               "timed batches); latency: one query a call. recall@10 vs exact: against exact "
               "MaxSim on the original vectors; vs tartan: against tartan's exhaustive search.\n")
    out.append("| engine | device | threads | setting | recall@10 vs exact | vs tartan | "
               "queries/s | queries/s per core | queries/CPU-s | p50 ms | p99 ms | load | "
               "parameters |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(searches, key=lambda r: (eng_key(r["engine"]), kind_of(r), r["threads"],
                                             -(r.get("recall_exact") or 0))):
        out.append(f"| {r['engine']} | {kind_of(r)} | {r['threads']} | {r['setting']} | "
                   f"{fmt(r.get('recall_exact'), 4)} | {fmt(r.get('recall_tartan'), 4)} | "
                   f"{fmt(r['batch_qps'])} | {fmt(r['qps_per_core'])} | "
                   f"{fmt(r.get('qps_per_cpu_s'))} | "
                   f"{fmt(r.get('latency_p50_ms'), 2)} | {fmt(r.get('latency_p99_ms'), 2)} | "
                   f"{load_str(r)} | {params_str(r.get('params'))} |")
    out.append("")
    # at equal recall
    groups = sorted({(kind_of(r), r["threads"]) for r in searches})
    top = max((r.get("recall_exact") or 0) for r in searches) if searches else 0
    levels = [x for x in LEVELS if x <= top + 1e-9]
    engines = [e for e in ENGINE_ORDER if any(r["engine"] == e for r in searches)]
    engines += sorted({r["engine"] for r in searches} - set(engines))
    for metric, what in (("qps_per_core", "queries/s per core (GPU: queries/s)"),
                         ("qps_per_cpu_s", "queries per CPU second of the process")):
        if not levels or not any(r.get(metric) for r in searches):
            continue
        out.append(f"At equal recall, {what}: the best among an engine's settings whose "
                   "recall@10 vs exact reaches the level; ratio = tartan's best (any nbits) / "
                   "the best peer's.\n")
        out.append("| device | threads | recall@10 vs exact >= | "
                   + " | ".join(engines) + " | tartan / best peer |")
        out.append("|---|---|---|" + "---|" * len(engines) + "---|")
        for kind, t in groups:
            for lv in levels:
                best = {}
                for e in engines:
                    ok = [r[metric] for r in searches
                          if r["engine"] == e and kind_of(r) == kind and r["threads"] == t
                          and (r.get("recall_exact") or 0) >= lv and r.get(metric)]
                    best[e] = max(ok) if ok else None
                peers = [v for e, v in best.items() if not e.startswith("tartan") and v]
                ours = [v for e, v in best.items() if e.startswith("tartan") and v]
                ratio = (max(ours) / max(peers)) if ours and peers else None
                if not any(best.values()):
                    continue
                out.append(f"| {kind} | {t} | {lv} | "
                           + " | ".join(fmt(best[e]) for e in engines)
                           + f" | {fmt(ratio, 2) + 'x' if ratio else ''} |")
        out.append("")
    for r in errors:
        out.append(f"- error: {r['engine']} {r.get('setting')} ({r.get('threads')} threads): "
                   f"{r.get('error')}")
    if errors:
        out.append("")
    return out


def plot(corpus, recs, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
        return False
    searches = [r for r in recs if r.get("kind") == "search" and r.get("recall_exact") is not None]
    has_gpu = any(kind_of(r) == "gpu" for r in searches)
    fig, axes = plt.subplots(1, 2 if has_gpu else 1, figsize=(13 if has_gpu else 7.5, 5.2),
                             squeeze=False)
    for ax, kind in zip(axes[0], ["cpu", "gpu"]):
        sel = [r for r in searches if kind_of(r) == kind]
        lines = {}
        for r in sel:
            lines.setdefault((r["engine"], r["threads"]), []).append(r)
        for (e, t), rs in sorted(lines.items(), key=lambda x: (eng_key(x[0][0]), x[0][1])):
            # every setting a marker; the line joins the Pareto front (no setting both faster
            # and of higher recall)
            rs.sort(key=lambda r: (-r["recall_exact"], -r["qps_per_core"]))
            front, best = [], 0.0
            for r in rs:
                if r["qps_per_core"] > best:
                    front.append(r)
                    best = r["qps_per_core"]
            front.reverse()
            lab = f"{e}, {t} thread{'s' if t != 1 else ''}" if kind == "cpu" else e
            col = COLOURS.get(e, "k")
            ax.plot([r["recall_exact"] for r in rs], [r["qps_per_core"] for r in rs],
                    marker=MARKERS.get(t, "o"), color=col, linestyle="none", markersize=4,
                    alpha=0.5)
            ax.plot([r["recall_exact"] for r in front], [r["qps_per_core"] for r in front],
                    marker=MARKERS.get(t, "o"), color=col, label=lab, markersize=5, linewidth=1,
                    linestyle="-" if t == 1 or kind == "gpu" else (":" if t >= 16 else "--"))
            for r in rs:
                if r["setting"] == "default":
                    ax.plot([r["recall_exact"]], [r["qps_per_core"]], marker="*",
                            color=COLOURS.get(e, "k"), markersize=12, linestyle="none")
        ax.set_yscale("log")
        ax.set_xlabel("recall@10 against exact MaxSim")
        ax.set_ylabel("queries/s per core" if kind == "cpu" else "queries/s (one GPU)")
        ax.set_title(f"{corpus}: {'CPU' if kind == 'cpu' else 'GPU'} (star: defaults)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--md", default=None, help="default OUTDIR/peers-table.md")
    a = ap.parse_args()
    recs = load(a.outdir)
    if not recs:
        sys.exit(f"no records under {a.outdir}/*/*.jsonl")
    by = {}
    for r in recs:
        by.setdefault(r["corpus"], []).append(r)
    md = ["## Side by side (bench/peers_run.sh)\n"]
    for corpus in sorted(by):
        md += table(corpus, by[corpus])
        png = os.path.join(a.outdir, f"peers-{corpus}.png")
        if plot(corpus, by[corpus], png):
            md.append(f"![{corpus}](peers-{corpus}.png)\n")
    path = a.md or os.path.join(a.outdir, "peers-table.md")
    with open(path, "w") as f:
        f.write("\n".join(md) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
