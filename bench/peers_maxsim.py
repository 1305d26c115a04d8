#!/usr/bin/env python3
"""Peers on the shapes of bench/bench_kernels_gpu, timed the same way, in the same run.

    python3 bench/peers_maxsim.py [--ours gpu.json] [--json peers.json] [--reps N] [--only NAME]

Measures PyTorch's device copy bandwidth and bf16 GEMM rate (the ceilings; cuBLAS is not
linked into tartan), then times naive PyTorch (einsum + max + sum), late-interaction-kernels
and flash-maxsim where importable, on the same shapes and data distributions as
bench_kernels_gpu: random normal embeddings, ragged lengths uniform in [26, 300] drawn with the
same counter-based generator, inputs rotated among 4 copies where one copy is under 4x L2.
Each time is the median of N calls with CUDA events around each call, after 5 warm-up calls.
With --ours, prints the combined table: each peer's time over tartan's (how many times faster
tartan is), tartan's TB/s against the copy ceiling and TFLOP/s against the GEMM rate.
"""
import argparse
import json
import sys

import torch

M64 = (1 << 64) - 1


def mix(z):
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def ragged_lengths(nd, seed=1):
    return [26 + mix(seed * 7919 + i) % 275 for i in range(nd)]


def time_us(fn, reps):
    for i in range(5):
        fn(i)
    torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    t = []
    for i in range(reps):
        a.record()
        fn(i)
        b.record()
        b.synchronize()
        t.append(a.elapsed_time(b) * 1e3)
    t.sort()
    return t[len(t) // 2]


def ceilings(reps):
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    us = time_us(lambda i: dst.copy_(src), reps)
    copy = 2 * n / (us * 1e-6) / 1e12
    del src, dst
    m = 8192
    A = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    us = time_us(lambda i: A @ B, max(10, reps // 5))
    gemm = 2 * m**3 / (us * 1e-6) / 1e12
    return copy, gemm


def peers():
    out = {}
    try:
        import late_interaction_kernels as lik
        from late_interaction_kernels import plaid as lik_plaid

        out["lik"] = (lik, lik_plaid)
        print("late-interaction-kernels", getattr(lik, "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print("late-interaction-kernels not importable:", e)
    try:
        import flash_maxsim as fm

        out["flash"] = fm
        print("flash-maxsim", getattr(fm, "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print("flash-maxsim not importable:", e)
    return out


def naive_dense(Q, D):
    # Q [nq, lq, d], D [nd, ld, d] -> [nq, nd]
    return torch.einsum("qid,njd->qnij", Q, D).amax(dim=-1).float().sum(dim=-1)


def sets_for(nbytes, l2):
    return 1 if nbytes > 4 * l2 else 4


def run(args):
    dev = torch.cuda.get_device_properties(0)
    l2 = getattr(dev, "L2_cache_size", 50 << 20)
    print(f"device: {dev.name}, {dev.multi_processor_count} SMs, L2 {l2 / 1e6:.0f} MB, torch {torch.__version__}")
    copy, gemm = ceilings(args.reps)
    print(f"copy: {copy:.3f} TB/s   bf16 GEMM 8192^3: {gemm:.1f} TFLOP/s\n")
    P = peers()
    res = {}
    reps = args.reps

    def want(name):
        return args.only is None or args.only in name

    def record(shape, who, fn):
        try:
            us = time_us(fn, reps)
        except Exception as e:  # noqa: BLE001
            print(f"  {shape:14s} {who:8s} failed: {type(e).__name__}: {str(e)[:200]}")
            torch.cuda.empty_cache()
            return
        res.setdefault(shape, {})[who] = us
        print(f"  {shape:14s} {who:8s} {us:10.1f} us")
        sys.stdout.flush()

    d = 128
    for shape, nq, lq, nd, ld in [
        ("rerank_10k", 1, 32, 10000, 300),
        ("rerank_1k", 1, 32, 1000, 300),
        ("multi_32x10k", 32, 32, 10000, 300),
        ("colpali_1k", 1, 1024, 1000, 1030),
    ]:
        if not want(shape):
            continue
        ns = sets_for(nd * ld * d * 2, l2)
        Qs = [torch.randn(nq, lq, d, device="cuda", dtype=torch.bfloat16) for _ in range(ns)]
        Ds = [torch.randn(nd, ld, d, device="cuda", dtype=torch.bfloat16) for _ in range(ns)]
        record(shape, "torch", lambda i: naive_dense(Qs[i % ns], Ds[i % ns]))
        torch.cuda.empty_cache()
        if "lik" in P:
            lik = P["lik"][0]
            record(shape, "lik", lambda i: lik.maxsim(Qs[i % ns], Ds[i % ns]))
        if "flash" in P:
            fm = P["flash"]
            if nq == 1:
                record(shape, "flash", lambda i: fm.flash_maxsim(Qs[i % ns][0], Ds[i % ns]))
                if lq >= 512:
                    record(shape, "flash_sk", lambda i: fm.flash_maxsim(Qs[i % ns][0], Ds[i % ns], splitk=True))
            else:
                record(shape, "flash", lambda i: fm.flash_maxsim_batched(Qs[i % ns], Ds[i % ns]))
        del Qs, Ds
        torch.cuda.empty_cache()

    if want("ragged_10k"):
        nd, lq = 10000, 32
        lens = ragged_lengths(nd)
        tot = sum(lens)
        cu = torch.zeros(nd + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int32), 0)
        cu = cu.cuda()
        ns = sets_for(tot * d * 2, l2)
        Q = [torch.randn(lq, d, device="cuda", dtype=torch.float16) for _ in range(ns)]
        Dp = [torch.randn(tot, d, device="cuda", dtype=torch.float16) for _ in range(ns)]
        cuq = torch.tensor([0, lq], dtype=torch.int32, device="cuda")
        # naive: padded [nd, 300, d] with a mask, built outside the timing
        maxl = max(lens)
        idx = torch.arange(maxl, device="cuda")[None, :]
        lt = torch.tensor(lens, device="cuda")[:, None]
        mask = idx < lt
        pad = []
        for s in range(ns):
            P_ = torch.zeros(nd, maxl, d, device="cuda", dtype=torch.float16)
            P_[mask] = Dp[s]
            pad.append(P_)

        def naive_ragged(i):
            s = torch.einsum("id,njd->nij", Q[i % ns], pad[i % ns])
            return s.masked_fill(~mask[:, None, :], float("-inf")).amax(-1).float().sum(-1)

        record("ragged_10k", "torch", naive_ragged)
        del pad
        torch.cuda.empty_cache()
        if "lik" in P:
            lik = P["lik"][0]
            record("ragged_10k", "lik", lambda i: lik.maxsim_varlen(Q[i % ns], Dp[i % ns], cuq, cu, lq, maxl))
        if "flash" in P:
            fm = P["flash"]
            record("ragged_10k", "flash", lambda i: fm.flash_maxsim_packed(Q[i % ns], Dp[i % ns], cu, maxl))
        del Q, Dp
        torch.cuda.empty_cache()

    if want("plaid_10k"):
        nd, lq, K, nbits = 10000, 32, 16384, 2
        lens = ragged_lengths(nd)
        tot = sum(lens)
        cu = torch.zeros(nd + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int32), 0)
        cu = cu.cuda()
        Q = torch.nn.functional.normalize(torch.randn(lq, d, device="cuda"), dim=-1)
        C = torch.nn.functional.normalize(torch.randn(K, d, device="cuda"), dim=-1)
        w = torch.tensor([-0.045, -0.012, 0.012, 0.045], device="cuda")
        ns = 4
        codes = [torch.randint(0, K, (tot,), device="cuda", dtype=torch.int32) for _ in range(ns)]
        resid = [torch.randint(0, 256, (tot, d * nbits // 8), device="cuda", dtype=torch.uint8) for _ in range(ns)]
        maxl = max(lens)
        idx = torch.arange(maxl, device="cuda")[None, :]
        mask = idx < torch.tensor(lens, device="cuda")[:, None]
        shifts = torch.tensor([6, 4, 2, 0], device="cuda", dtype=torch.uint8)

        def naive_plaid(i):
            r = resid[i % ns]
            b = (r[:, :, None] >> shifts) & 3  # [tot, 32, 4]
            e = C[codes[i % ns]] + w[b.reshape(tot, d).long()]
            e = torch.nn.functional.normalize(e, dim=-1)
            P_ = torch.zeros(nd, maxl, d, device="cuda")
            P_[mask] = e
            s = torch.einsum("id,njd->nij", Q, P_)
            return s.masked_fill(~mask[:, None, :], float("-inf")).amax(-1).sum(-1)

        record("plaid_10k", "torch", naive_plaid)
        torch.cuda.empty_cache()
        if "lik" in P:
            lp = P["lik"][1]
            record(
                "plaid_10k",
                "lik",
                lambda i: lp.maxsim_residual_varlen(Q, codes[i % ns], resid[i % ns], cu, C, w, nbits, max_seqlen_d=maxl),
            )
        del codes, resid
        torch.cuda.empty_cache()
    return {"device": dev.name, "copy_tbps": copy, "gemm_tflops": gemm, "peers_us": res}


def table(p, ours):
    print("\n== tartan vs peers (same run) ==")
    print(f"device {p['device']}; copy {p['copy_tbps']:.3f} TB/s (torch), bf16 GEMM {p['gemm_tflops']:.0f} TFLOP/s (torch)")
    if ours:
        print(f"tartan's own copy measurement: {ours['copy_tbps']:.3f} TB/s")
    hdr = f"{'shape':14s} {'tartan us':>10s} {'TB/s':>6s} {'%copy':>6s} {'TFLOP/s':>8s} {'%gemm':>6s}"
    whos = ["torch", "lik", "flash", "flash_sk"]
    for w in whos:
        hdr += f" {w + ' us':>11s} {'x':>6s}"
    print(hdr)
    shapes = {s["name"]: s for s in ours["shapes"]} if ours else {}
    names = list(shapes) if shapes else list(p["peers_us"])
    for n in names:
        s = shapes.get(n)
        base = n if n in p["peers_us"] else n.replace("_qc", "")
        line = f"{n:14s}"
        if s:
            line += f" {s['us']:10.1f} {s['tbps']:6.2f} {100 * s['tbps'] / p['copy_tbps']:5.1f}% {s['tflops']:8.1f} {100 * s['tflops'] / p['gemm_tflops']:5.1f}%"
        else:
            line += " " * 42
        for w in whos:
            t = p["peers_us"].get(base, {}).get(w)
            if t is None:
                line += f" {'-':>11s} {'':>6s}"
            else:
                line += f" {t:11.1f} {(t / s['us']) if s else 0:6.2f}"
        print(line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours")
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--only")
    args = ap.parse_args()
    p = run(args)
    ours = None
    if args.ours:
        with open(args.ours) as f:
            ours = json.load(f)
    table(p, ours)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peers": p, "ours": ours}, f, indent=1)


if __name__ == "__main__":
    main()
