/*
 * model.h: an index's trained model in memory (centroids and codec), as the writer builds and
 * uses it; internal to index/.
 */
#ifndef TARTAN_INDEX_MODEL_H
#define TARTAN_INDEX_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "codec.h"
#include "index.h"

typedef struct idx_model {
    uint32_t k;
    float *centroids; /* [k, dim], owned */
    idx_codec codec;
} idx_model;

/*
 * Trains a model from n sample tokens x [n, dim] (L2-normalised): k centroids (k_req, or from
 * corpus_tokens by DESIGN's rule, at most the points k-means gets), spherical k-means on 95% of
 * the tokens and the codec from the held-out 5% (at most 50,000). On KERN_DEV_CPU k-means is
 * FAISS's; on KERN_DEV_CUDA it is idx_kmeans_device's (assign.h: the same sample, K, init and
 * iteration rules, assignment on the GPU). TARTAN_ETRAIN, TARTAN_EEMPTY, ENOMEM, and the
 * device's errors (TARTAN_ENODEV, TARTAN_EDEVICE). Shuffles x in place (the sample is the
 * largest thing a build holds: no copy).
 */
int idx_model_train(kern_dev dev, float *x, size_t n, size_t dim, unsigned nbits, size_t k_req,
                    size_t corpus_tokens, int iters, uint64_t seed, idx_model *out, store_msg *m);
void idx_model_free(idx_model *mod);

/* Loads the stored model of a trained index (copies): TARTAN_ENOTTRAINED if none. */
int idx_model_load(store_txn *txn, const store_header *h, idx_model *out, store_msg *m);

/* Writes a model into a transaction (centroids, codec) and sets h's centroid fields. */
int idx_model_store(store_txn *txn, const idx_model *mod, store_header *h, store_msg *m);

#endif
