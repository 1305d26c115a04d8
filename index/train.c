/*
 * train.c: centroids and codec from a sample (DESIGN.md section 3): spherical k-means
 * (idx_kmeans_device, on the CPU or a GPU) on most of the sample, the codec's cutoffs and weights
 * fitted (Lloyd-Max from the quantiles) to the residuals of the rest.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "assign.h"
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
}

int idx_model_train(kern_dev dev, float *x, size_t n, size_t dim, unsigned nbits, size_t k_req,
                    size_t corpus_tokens, int iters, uint64_t seed, idx_model *out, store_msg *m)
{
    memset(out, 0, sizeof *out);
    if (n < 2)
        return store_fail(m, TARTAN_EEMPTY, "training needs at least 2 tokens, the sample has %zu",
                          n);
    size_t held = (size_t)(HELDOUT_FRACTION * (double)n);
    if (held > HELDOUT_MAX)
        held = HELDOUT_MAX;
    if (held == 0)
        held = 1;
    size_t ntrain = n - held;
    size_t k = k_req ? k_req : idx_plan_centroids(corpus_tokens ? corpus_tokens : n);
    if (k > ntrain)
        k = ntrain; /* k-means cannot make more centroids than it has points */
    if (k > UINT32_MAX)
        return store_fail(m, TARTAN_ERANGE, "%zu centroids is too many", k);

    /* A seeded shuffle decides which tokens train k-means and which are held out. */
    float *tmp = malloc(dim * sizeof(float));
    float *cent = malloc(k * dim * sizeof(float));
    float *resid = malloc(held * dim * sizeof(float));
    uint32_t *lab = malloc(held * sizeof *lab);
    int rc = 0;
    if (!tmp || !cent || !resid || !lab) {
        rc = store_fail(m, ENOMEM, "out of memory training on %zu tokens", n);
        goto done;
    }
    /* In place: the sample is the largest thing a build holds, so it is never copied.
     * Fisher-Yates from the end: step i fixes position i, so the first `held` steps already
     * decide the held-out set and the rest would only reorder the training set, whose order
     * k-means does not depend on (it draws its points by its own seeded rule), so the shuffle
     * stops there (a swap costs about 0.6 us: 36 s of one core for the 57M-token sample of a
     * 100k-page ColPali corpus). */
    uint64_t st = seed;
    for (size_t i = n - 1; i > ntrain - 1; i--) {
        size_t j = (size_t)(idx_rand_next(&st) % (i + 1));
        if (j == i)
            continue;
        memcpy(tmp, x + i * dim, dim * sizeof(float));
        memcpy(x + i * dim, x + j * dim, dim * sizeof(float));
        memcpy(x + j * dim, tmp, dim * sizeof(float));
    }
    float *shuf = x;
    /* One k-means for both devices (assign.h): only the assignment step looks at the device.
     * On the CPU it replaced FAISS's Clustering, whose BLAS assignment ran 1.6-1.8x slower than
     * the project's kernel on the build host and whose result depended on the sample's order. */
    if ((rc = idx_kmeans_device(dev, shuf, ntrain, dim, k, iters, MAX_PER_CENTROID, seed, cent, m)))
        goto done;
    /* The index stores its centroids as fp16 (FORMAT.md "centroids"): codes, residuals and
     * norms are computed against exactly the values stored. */
    for (size_t i = 0; i < k * dim; i++)
        cent[i] = store_f16_to_f32(store_f32_to_f16(cent[i]));
    const float *hx = shuf + ntrain * dim;
    if ((rc = idx_assign(dev, cent, k, dim, hx, held, lab, NULL, m)))
        goto done;
    for (size_t i = 0; i < held; i++)
        for (size_t j = 0; j < dim; j++)
            resid[i * dim + j] = hx[i * dim + j] - cent[(size_t)lab[i] * dim + j];
    if (idx_codec_fit(&out->codec, dim, nbits, resid, held, CODEC_FIT_ITERS)) {
        rc = store_fail(m, TARTAN_ETRAIN, "training the %u-bit codec on %zu residuals failed",
                        nbits, held);
        goto done;
    }
    out->k = (uint32_t)k;
    out->centroids = cent;
    cent = NULL;
done:
    free(tmp);
    free(cent);
    free(resid);
    free(lab);
    return rc;
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
    out->centroids = malloc((size_t)h->n_centroids * h->dim * sizeof(float));
    if (!out->centroids)
        return store_fail(m, ENOMEM, "out of memory");
    memcpy(out->centroids, c, (size_t)h->n_centroids * h->dim * sizeof(float));
    out->k = h->n_centroids;
    return 0;
}

int idx_model_store(store_txn *txn, const idx_model *mod, store_header *h, store_msg *m)
{
    int rc = store_centroids_put(txn, mod->k, h->dim, mod->centroids, STORE_CENT_F16, m);
    if (!rc)
        rc = store_codec_put(txn, h->nbits, mod->codec.cutoffs, mod->codec.weights, m);
    if (rc)
        return rc;
    h->n_centroids = mod->k;
    h->code_bytes = mod->k <= 65536u ? 2 : 4;
    return 0;
}
