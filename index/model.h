/*
 * model.h: an index's trained model in memory (centroids and codec), as the writer builds and
 * uses it; internal to index/.
 */
#ifndef TARTAN_INDEX_MODEL_H
#define TARTAN_INDEX_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "axes.h"
#include "codec.h"
#include "group.h"
#include "index.h"

typedef struct idx_model {
    uint32_t k;
    float *centroids; /* [k, dim], owned */
    idx_codec codec;
    /* The residual code by principal axes (axes.h) when trained with it (axes.rot not NULL):
     * documents are then coded with it, and codec is stored beside it unused. Owned. */
    idx_axes axes;
} idx_model;

/* The meta record holding the axes code (FORMAT.md "meta/codec.axes"). */
#define IDX_META_AXES "codec.axes"

/*
 * Trains a model from n sample tokens x [n, dim] (L2-normalised): k centroids (k_req, or from
 * corpus_tokens by DESIGN's rule, at most the points k-means gets), spherical k-means
 * (idx_kmeans_device, assign.h) on 95% of the tokens and the codec from the held-out 5% (at
 * most 50,000: a seeded selection). TARTAN_ETRAIN, TARTAN_EEMPTY, TARTAN_ERANGE, ENOMEM, and
 * the device's errors (TARTAN_ENODEV, TARTAN_EDEVICE). Reorders x in place (the held-out rows
 * taken out; the sample is the largest thing a build holds: no copy). The group of one's
 * idx_model_train_group.
 */
int idx_model_train(kern_dev dev, float *x, size_t n, size_t dim, unsigned nbits, size_t k_req,
                    size_t corpus_tokens, int iters, uint64_t seed, unsigned codec, idx_model *out,
                    store_msg *m);

/*
 * The same, shared by the members of a group (group.h), each with its own part x [n, dim] of
 * the sample (n may be 0): the group's sample is the members' parts in rank order, and every
 * member ends with the model one process trains from that whole sample, bit for bit (see
 * idx_kmeans_group for the one proviso), with the held-out tokens a selection over the group's
 * sample and the codec fitted on rank 0 to every member's held-out residuals. nbits, k_req,
 * corpus_tokens, iters, seed and codec must be the same on every member. codec: TARTAN_CODEC_
 * SCALAR, or TARTAN_CODEC_AXES to fit the axes code too (nbits 1, 2 or 4, dim at most
 * IDX_AXES_MAX_DIM, else TARTAN_EINVAL). times: may be NULL. Errors as idx_model_train's where
 * they arose, TARTAN_EGROUP on the other members.
 */
int idx_model_train_group(kern_dev dev, float *x, size_t n, size_t dim, unsigned nbits,
                          size_t k_req, size_t corpus_tokens, int iters, uint64_t seed,
                          unsigned codec, idx_group *g, idx_model *out, idx_train_times *times,
                          store_msg *m);
void idx_model_free(idx_model *mod);

/*
 * The stored axes code of an index (copies into x): TARTAN_ENOTFOUND (no message) when it has
 * none, TARTAN_ECORRUPT when the record is damaged or does not fit h's dim and nbits.
 */
int idx_axes_get(store_txn *txn, const store_header *h, idx_axes *x, store_msg *m);
/* The same from the record's bytes blob [len] (idx_axes_get's checks, without the read). */
int idx_axes_parse(const void *blob, size_t len, const store_header *h, idx_axes *x, store_msg *m);

/* Loads the stored model of a trained index (copies): TARTAN_ENOTTRAINED if none. */
int idx_model_load(store_txn *txn, const store_header *h, idx_model *out, store_msg *m);

/* Writes a model into a transaction (centroids, codec) and sets h's centroid fields. */
int idx_model_store(store_txn *txn, const idx_model *mod, store_header *h, store_msg *m);

#endif
