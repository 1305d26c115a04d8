/*
 * calibrate.h: the index's search calibration (layer prefix eng_; engine/SEARCH.md): how
 * wide a probe margin kept each share of the exhaustive top 10 and top 100 on the
 * calibration queries, stored under meta "calibration" (storage/FORMAT.md), and how a search
 * turns it, its k and its recall target into a margin, a probe cap and a stopping rule.
 */
#ifndef TARTAN_ENGINE_CALIBRATE_H
#define TARTAN_ENGINE_CALIBRATE_H

#include <stddef.h>
#include <stdint.h>

#include "store.h"
#include "tartan.h"

/* Coverage levels a calibration measures the margin for. */
#define ENG_CALIB_LEVELS 5

/* The stored calibration (FORMAT.md "meta/calibration"), or the built-in table. */
typedef struct eng_calib {
    int calibrated; /* 0: the built-in table below */
    uint32_t flags; /* ENG_CALIB_FROM_QUERIES */
    uint32_t n_queries;
    uint64_t n_docs, n_reference_docs;
    float levels[ENG_CALIB_LEVELS];    /* shares of the top k covered, ascending */
    float margin10[ENG_CALIB_LEVELS];  /* margin that covered each share of the top 10 */
    float margin100[ENG_CALIB_LEVELS]; /* ... of the top 100 */
    float recall10, recall100;         /* default search's measured recall */
    double candidates10, exact10, seconds;
    /* Short queries (version 2): the same margins measured on pseudo-queries of short_len
     * tokens (their first tokens); short_len 0 when not measured (the caller's own queries,
     * a version 1 record, the built-in table). */
    uint32_t short_len;
    float margin10s[ENG_CALIB_LEVELS], margin100s[ENG_CALIB_LEVELS];
} eng_calib;

#define ENG_CALIB_FROM_QUERIES 1u

/* The built-in table: what an index never calibrated searches with. */
void eng_calib_default(eng_calib *c);

/* Reads the calibration of the snapshot txn into c (the built-in table when there is none).
 * TARTAN_ECORRUPT for a record of the wrong size or with values out of range. */
int eng_calib_read(store_txn *txn, eng_calib *c, store_msg *m);

/* Writes c as meta "calibration" in txn. */
int eng_calib_write(store_txn *txn, const eng_calib *c, store_msg *m);

/* The probe margin for a search of k results aiming at recall target (0 < target < 1), for
 * queries of lq tokens: a query of fewer tokens than the pseudo-queries reaches a document
 * through fewer of them and needs a wider margin (interpolated in log lq between the short
 * and the full pseudo-queries' margins where both were measured). */
float eng_calib_margin(const eng_calib *c, size_t k, float target, size_t lq);

/* Probes per query token at most (the margin's cap) for k results. */
size_t eng_probe_cap(size_t k);

/* The stopping rule's z for a recall target. */
float eng_rerank_z(float target);

/* The default recall target (tartan_search_params.recall_target 0). */
#define ENG_DEFAULT_TARGET 0.95f

/* Fills the public view of c; n_docs_now: the live documents now (for stale). */
void eng_calib_public(const eng_calib *c, uint64_t n_docs_now, tartan_calibration *out);

#endif
