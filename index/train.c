/*
 * train.c: centroids and codec from a sample (DESIGN.md section 3): spherical k-means
 * (idx_kmeans_device, on the CPU or a GPU) on most of the sample, the codec's cutoffs and weights
 * fitted (Lloyd-Max from the quantiles) to the residuals of the rest.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "assign.h"
#include "group.h"
#include "kmeans.h"
#include "model.h"
#include "plan.h"
#include "rand.h"
#include "tartan.h"

/* ColBERTv2's hold-out for the codec: 5% of the sample, at most 50,000 vectors. */
#define HELDOUT_FRACTION 0.05
#define HELDOUT_MAX 50000
/* Training points per centroid, at most (a seeded subset beyond: idx_kmeans_device). FAISS's
 * cap is 256; 64 keeps k-means of a 1.45M-token corpus (K 16,384) on 1M points instead of all
 * 1.4M, and on the synthetic families and SciFact it left recall where it was (bench/RESULTS.md,
 * "Codec fidelity"): a centroid's mean is settled well before 64 points. */
#define MAX_PER_CENTROID 64
/* Lloyd-Max steps fitting the codec's tables to the held-out residuals (idx_codec_fit). From
 * the quantile start the tables settle within about 30 steps on the synthetic families and
 * SciFact (bench/fidelity.sh); each is one pass over the held-out values (at most 50,000 x dim),
 * well under a second in all, negligible next to k-means. */
#define CODEC_FIT_ITERS 30

void idx_model_free(idx_model *mod)
{
    if (!mod)
        return;
    free(mod->centroids);
    mod->centroids = NULL;
    idx_axes_free(&mod->axes);
}

/* Rank 0's axes code to every member: its size, then its stored form; size 0 when rank 0 has
 * none (TARTAN_CODEC_AUTO kept the scalar code). */
static int bcast_axes(idx_group *g, idx_axes *x, store_msg *m)
{
    uint64_t len = g->rank == 0 && x->rot ? idx_axes_bytes(x) : 0;
    int rc = idx_group_bcast(g, &len, sizeof len, m);
    if (rc || len == 0)
        return rc;
    uint8_t *blob = malloc(len ? len : 1);
    if (g->rank == 0 && blob)
        idx_axes_save(x, blob);
    rc = idx_group_check(g, blob ? 0 : store_fail(m, ENOMEM, "out of memory"), m);
    if (!rc)
        rc = idx_group_bcast(g, blob, len, m);
    char why[200];
    if (!rc && g->rank != 0 && idx_axes_load(x, blob, len, why))
        rc = store_fail(m, TARTAN_EGROUP, "the axes code from rank 0: %s", why);
    free(blob);
    return idx_group_check(g, rc, m);
}

/*
 * TARTAN_CODEC_AUTO: both codes fitted on the first held-out residuals and judged by their
 * error on the last fifth (AUTO_CHECK_SHARE), unseen by either fit; the axes code (fitted on
 * the first part, *x) only where it cuts that error by AUTO_MARGIN or more, else none (the
 * scalar code). Measured (bench/RESULTS.md, "Codec fidelity"): where the axes code lowered the
 * token error by 28-45% (model 3, SciFact) it raised recall against exact search by
 * 0.009-0.025; where the two errors were within 3% (models 1 and 2) recall moved either way,
 * by up to 0.026 against the axes code (model 1, 100k documents). Fewer than AUTO_MIN_HELD
 * residuals judge nothing (a per-axis fit on a few hundred overfits): the scalar code.
 * Nor where the GPU multiplies the scalar code on its tensor cores at this dim and has no
 * table kernel for the axes code (kern_residual_mma_dim: d 256 to 768) unless the fitted
 * levels are additive in the bits (idx_axes_additive: the bit-plane kernels serve any dim):
 * without either, the axes code would make GPU search tens of times slower (d 384: exhaustive
 * 20.9 ms a query against 0.17 ms, default search 730 queries/s against 34,488; H200,
 * 2026-11-29), for recall 0.01 higher (SciFact). The CPU reads both codes as fast.
 * Returns 0, with or without a code (without, where memory or a fit fails: the scalar code,
 * fitted on every residual, is always there).
 */
#define AUTO_CHECK_SHARE 5
#define AUTO_MARGIN 0.10
#define AUTO_MIN_HELD 4000
static int choose_axes(size_t dim, unsigned nbits, const float *res, size_t held, idx_axes *x)
{
    if (held < AUTO_MIN_HELD)
        return 0;
    /* Every AUTO_CHECK_SHARE-th residual checks, the others fit: the held-out rows come in the
     * sample's order, so a tail would check on the corpus's last documents only. */
    const size_t nc = held / AUTO_CHECK_SHARE, nf = held - nc;
    float *fit = malloc(nf * dim * sizeof *fit), *check = malloc(nc * dim * sizeof *check);
    if (!fit || !check) {
        free(fit);
        free(check);
        return 0; /* no memory to weigh them: the scalar code stands */
    }
    for (size_t i = 0, f = 0, c = 0; i < held; i++) {
        const int to_check = i % AUTO_CHECK_SHARE == AUTO_CHECK_SHARE - 1 && c < nc;
        memcpy(to_check ? check + c++ * dim : fit + f++ * dim, res + i * dim, dim * sizeof *res);
    }
    idx_codec sc;
    idx_axes ax;
    if (idx_codec_fit(&sc, dim, nbits, fit, nf, CODEC_FIT_ITERS) ||
        idx_axes_fit(&ax, dim, nbits, fit, nf, CODEC_FIT_ITERS)) {
        free(fit);
        free(check);
        return 0; /* no fit to weigh: the scalar code, fitted on every residual, stands */
    }
    const double es = idx_codec_sq_error(&sc, check, nc), ea = idx_axes_sq_error(&ax, check, nc);
    free(fit);
    free(check);
    if (kern_residual_mma_dim(dim, 0) && !kern_residual_mma_dim(dim, 1) &&
        !idx_axes_additive(&ax)) {
        if (idx_trace())
            fprintf(stderr,
                    "codec auto: scalar (no tensor-core GPU kernel for the axes code at "
                    "dim %zu: its levels are not additive in the bits)\n",
                    dim);
        idx_axes_free(&ax);
        return 0;
    }
    const int take = ea >= 0 && ea <= (1.0 - AUTO_MARGIN) * es;
    if (idx_trace())
        fprintf(stderr,
                "codec auto: error on %zu unseen residuals, scalar %.6g, axes %.6g (%.3f): %s\n",
                nc, es, ea, es > 0 ? ea / es : 0.0, take ? "axes" : "scalar");
    if (take)
        *x = ax;
    else
        idx_axes_free(&ax);
    return 0;
}

/* Removes the rows skip [ns] (ascending) from x [n, dim], keeping the others in order: each run
 * between two skipped rows moves down once (one sequential pass over the rows after the first
 * skipped one). */
static void drop_rows(float *x, size_t n, size_t dim, const size_t *skip, size_t ns)
{
    size_t w = 0, r = 0;
    for (size_t s = 0; s <= ns; s++) {
        size_t end = s < ns ? skip[s] : n;
        if (end > r) {
            if (w != r)
                memmove(x + w * dim, x + r * dim, (end - r) * dim * sizeof(float));
            w += end - r;
        }
        r = end + 1;
    }
}

int idx_model_train_group(kern_dev dev, float *x, size_t n, size_t dim, unsigned nbits,
                          size_t k_req, size_t corpus_tokens, int iters, uint64_t seed,
                          unsigned codec, idx_group *g, idx_model *out, idx_train_times *times,
                          store_msg *m)
{
    memset(out, 0, sizeof *out);
    /* AUTO weighs the axes code where it can code the index at all. */
    if (codec == TARTAN_CODEC_AUTO &&
        ((nbits != 1 && nbits != 2 && nbits != 4) || dim > IDX_AXES_MAX_DIM || dim * nbits % 8))
        codec = TARTAN_CODEC_SCALAR;
    if (codec == TARTAN_CODEC_AXES &&
        ((nbits != 1 && nbits != 2 && nbits != 4) || dim > IDX_AXES_MAX_DIM))
        return idx_group_check(
            g,
            store_fail(m, TARTAN_EINVAL,
                       "the axes code takes nbits 1, 2 or 4 and dim up to %u (this index: nbits "
                       "%u, dim %zu)",
                       IDX_AXES_MAX_DIM, nbits, dim),
            m);
    if (times)
        memset(times, 0, sizeof *times);
    size_t p = (size_t)g->size;
    size_t *cnt = malloc(2 * p * sizeof *cnt), *hsel = NULL;
    float *cent = NULL, *hx = NULL, *all = NULL;
    uint32_t *lab = NULL;
    int rc = 0;
    if (!cnt)
        rc = store_fail(m, ENOMEM, "out of memory");
    if ((rc = idx_group_counts(g, n, cnt, rc, m)))
        goto done;
    size_t *lens = cnt + p;
    size_t ntot = 0, off = 0;
    for (size_t r = 0; r < p; r++) {
        ntot += cnt[r];
        off += r < (size_t)g->rank ? cnt[r] : 0;
    }
    /* From here to the next exchange every member decides alike: the same counts. */
    if (ntot < 2) {
        rc = store_fail(m, TARTAN_EEMPTY, "training needs at least 2 tokens, the sample has %zu",
                        ntot);
        goto done;
    }
    size_t held = (size_t)(HELDOUT_FRACTION * (double)ntot);
    if (held > HELDOUT_MAX)
        held = HELDOUT_MAX;
    if (held == 0)
        held = 1;
    size_t ntrain = ntot - held;
    size_t k = k_req ? k_req : idx_plan_centroids(corpus_tokens ? corpus_tokens : ntot);
    if (k > ntrain)
        k = ntrain; /* k-means cannot make more centroids than it has points */
    if (k > UINT32_MAX) {
        rc = store_fail(m, TARTAN_ERANGE, "%zu centroids is too many", k);
        goto done;
    }
    /* The held-out tokens: a seeded selection of `held` of the group's tokens (each member
     * keeps its own), so that the same tokens are held out however the sample is split between
     * members. They are copied out; the rest train k-means in their order. */
    size_t hcap = n < held ? n : held, nh = 0, below;
    if (!(hsel = malloc((hcap ? hcap : 1) * sizeof *hsel)) ||
        !(hx = malloc((hcap ? hcap : 1) * dim * sizeof *hx)) ||
        !(lab = malloc((hcap ? hcap : 1) * sizeof *lab)) ||
        !(cent = malloc(k * dim * sizeof *cent)) ||
        (g->rank == 0 && !(all = malloc(held * dim * sizeof *all)))) {
        rc = store_fail(m, ENOMEM, "out of memory training on %zu tokens", n);
    } else {
        nh = idx_select_range(seed, ntot, held, off, off + n, hsel, &below);
        for (size_t i = 0; i < nh; i++)
            memcpy(hx + i * dim, x + hsel[i] * dim, dim * sizeof(float));
    }
    if ((rc = idx_group_check(g, rc, m)))
        goto done;
    /* k-means reads every training point in place when it uses them all: the held-out rows are
     * then taken out of x in place (the sample is the largest thing a build holds, so it is
     * never copied). When it draws a subset (more than MAX_PER_CENTROID points a centroid: its
     * own rule, repeated here), it copies its points out and skips the held-out rows itself,
     * and x stays as it is. */
    const size_t *skip = hsel;
    size_t nskip = nh;
    if (!(k <= SIZE_MAX / MAX_PER_CENTROID && ntrain > k * MAX_PER_CENTROID)) {
        drop_rows(x, n, dim, hsel, nh);
        skip = NULL;
        nskip = 0;
    }
    /* One k-means for both devices (assign.h): only the assignment step looks at the device.
     * On the CPU it replaced FAISS's Clustering, whose BLAS assignment ran 1.6-1.8x slower than
     * the project's kernel on the build host and whose result depended on the sample's order. */
    double t0 = idx_now();
    rc = idx_kmeans_group(dev, x, n - nh, skip, nskip, dim, k, iters, MAX_PER_CENTROID, seed, g,
                          cent, m);
    double t1 = idx_now();
    if (times)
        times->kmeans = t1 - t0;
    if (rc)
        goto done;
    /* The index stores its centroids as fp16 (FORMAT.md "centroids"): codes, residuals and
     * norms are computed against exactly the values stored. */
    for (size_t i = 0; i < k * dim; i++)
        cent[i] = store_f16_to_f32(store_f32_to_f16(cent[i]));
    /* The codec from every held-out residual: each member computes its own, rank 0 gathers
     * them (at most 50,000 x dim floats: 25 MB at dim 128) and fits, and sends the tables to
     * all. Fitting on rank 0's share alone would be cheaper but would give another codec with
     * every number of members; this one is the one process's, value for value. */
    rc = idx_assign(dev, cent, k, dim, hx, nh, lab, NULL, m);
    for (size_t i = 0; i < nh && !rc; i++)
        for (size_t j = 0; j < dim; j++)
            hx[i * dim + j] -= cent[(size_t)lab[i] * dim + j];
    if ((rc = idx_group_counts(g, nh * dim * sizeof(float), lens, rc, m)) ||
        (rc = idx_group_gather(g, hx, nh * dim * sizeof(float), all, lens, m)))
        goto done;
    if (g->rank == 0 && idx_codec_fit(&out->codec, dim, nbits, all, held, CODEC_FIT_ITERS))
        rc = store_fail(m, TARTAN_ETRAIN, "training the %u-bit codec on %zu residuals failed",
                        nbits, held);
    if ((rc = idx_group_check(g, rc, m)) ||
        (rc = idx_group_bcast(g, &out->codec, sizeof out->codec, m)))
        goto done;
    if (codec == TARTAN_CODEC_AXES) {
        if (g->rank == 0 && idx_axes_fit(&out->axes, dim, nbits, all, held, CODEC_FIT_ITERS))
            rc =
                store_fail(m, TARTAN_ETRAIN, "fitting the axes code on %zu residuals failed", held);
    } else if (codec == TARTAN_CODEC_AUTO && g->rank == 0) {
        rc = choose_axes(dim, nbits, all, held, &out->axes);
    }
    if (codec != TARTAN_CODEC_SCALAR) {
        if ((rc = idx_group_check(g, rc, m)) || (rc = bcast_axes(g, &out->axes, m)))
            goto done;
        if (idx_trace() && g->rank == 0 && out->axes.rot)
            fprintf(stderr, "axes code: %u / %u / %u / %u axes at 8 / 4 / 2 / 1 bits of %zu\n",
                    out->axes.n8, out->axes.n4, out->axes.n2, out->axes.n1, dim);
    }
    if (times)
        times->codec = idx_now() - t1;
    if (idx_trace())
        fprintf(stderr,
                "training, member %d of %d: k-means %.3f s, codec %.3f s (%zu held-out "
                "residuals: assigned, gathered, fitted on rank 0)\n",
                g->rank, g->size, t1 - t0, idx_now() - t1, held);
    out->k = (uint32_t)k;
    out->centroids = cent;
    cent = NULL;
done:
    if (rc) {
        memset(&out->codec, 0, sizeof out->codec);
        idx_axes_free(&out->axes);
    }
    free(cnt);
    free(hsel);
    free(hx);
    free(lab);
    free(cent);
    free(all);
    return rc;
}

int idx_model_train(kern_dev dev, float *x, size_t n, size_t dim, unsigned nbits, size_t k_req,
                    size_t corpus_tokens, int iters, uint64_t seed, unsigned codec, idx_model *out,
                    store_msg *m)
{
    idx_group g;
    idx_group_solo(&g);
    return idx_model_train_group(dev, x, n, dim, nbits, k_req, corpus_tokens, iters, seed, codec,
                                 &g, out, NULL, m);
}

int idx_axes_parse(const void *blob, size_t len, const store_header *h, idx_axes *x, store_msg *m)
{
    char why[200];
    if (idx_axes_load(x, blob, len, why))
        return store_fail(m, TARTAN_ECORRUPT, "meta '%s': %s", IDX_META_AXES, why);
    if (x->dim != h->dim || x->nbits != h->nbits) {
        unsigned xd = x->dim, xn = x->nbits;
        idx_axes_free(x);
        return store_fail(m, TARTAN_ECORRUPT,
                          "meta '%s' is for dim %u at %u bits, the index has dim %u at %u",
                          IDX_META_AXES, xd, xn, h->dim, h->nbits);
    }
    return 0;
}

int idx_axes_get(store_txn *txn, const store_header *h, idx_axes *x, store_msg *m)
{
    const void *d;
    size_t len;
    int rc = store_meta_get(txn, IDX_META_AXES, &d, &len, m);
    return rc ? rc : idx_axes_parse(d, len, h, x, m);
}

int idx_model_load(store_txn *txn, const store_header *h, idx_model *out, store_msg *m)
{
    memset(out, 0, sizeof *out);
    if (h->n_centroids == 0)
        return store_fail(m, TARTAN_ENOTTRAINED, "the index has no centroids yet");
    const float *c;
    int rc = store_centroids_get(txn, h->n_centroids, h->dim, &c, m);
    if (rc)
        return rc;
    out->codec.dim = h->dim;
    out->codec.nbits = h->nbits;
    if ((rc = store_codec_get(txn, h->nbits, out->codec.cutoffs, out->codec.weights, m)))
        return rc;
    if ((rc = idx_axes_get(txn, h, &out->axes, m)) && rc != TARTAN_ENOTFOUND)
        return rc;
    out->centroids = malloc((size_t)h->n_centroids * h->dim * sizeof(float));
    if (!out->centroids) {
        idx_axes_free(&out->axes);
        return store_fail(m, ENOMEM, "out of memory");
    }
    memcpy(out->centroids, c, (size_t)h->n_centroids * h->dim * sizeof(float));
    out->k = h->n_centroids;
    return 0;
}

int idx_model_store(store_txn *txn, const idx_model *mod, store_header *h, store_msg *m)
{
    int rc = store_centroids_put(txn, mod->k, h->dim, mod->centroids, STORE_CENT_F16, m);
    if (!rc)
        rc = store_codec_put(txn, h->nbits, mod->codec.cutoffs, mod->codec.weights, m);
    if (!rc && mod->axes.rot) {
        size_t len = idx_axes_bytes(&mod->axes);
        uint8_t *blob = malloc(len);
        if (!blob)
            return store_fail(m, ENOMEM, "out of memory");
        idx_axes_save(&mod->axes, blob);
        rc = store_meta_put(txn, IDX_META_AXES, blob, len, m);
        free(blob);
    }
    if (rc)
        return rc;
    h->n_centroids = mod->k;
    h->code_bytes = mod->k <= 65536u ? 2 : 4;
    return 0;
}
