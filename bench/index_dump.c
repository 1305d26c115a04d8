/*
 * index_dump.c: writes an index's centroids and every live token's centroid code as .npy, so
 * that bench/synth_stats.py can compare a synthetic corpus with real embeddings through the
 * index's own k-means (the codec's view of the data), not through a second clustering.
 *
 *   bench/index_dump INDEX OUTDIR [--decompressed]
 *
 * OUTDIR gets centroids.npy [K, dim] float32, codes.npy [T] int32 (tokens of the live
 * documents in document-number order), doclens.npy [N] int32 and ids.txt (one external id a
 * line, in the same order). A fresh `tartan build` numbers documents in input order, so the
 * codes line up with the embeddings the index was built from. With --decompressed, also
 * decompressed.npy [T, dim] float32: every live token as the index scores it (what exhaustive
 * search sees), for prototyping search stages outside the engine. It prints the counts and
 * whether the axes code's levels are additive in the bits (kernels.h kern_axes_additive).
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "index.h"
#include "npy.h"

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 1024;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * elem);
    if (!q)
        return ENOMEM;
    *p = q;
    *cap = n;
    return 0;
}

int main(int argc, char **argv)
{
    int decomp = argc == 4 && strcmp(argv[3], "--decompressed") == 0;
    if (argc != 3 && !decomp) {
        fprintf(stderr, "usage: %s INDEX OUTDIR [--decompressed]\n", argv[0]);
        return 2;
    }
    store_msg m = {0};
    store_env *env = NULL;
    int rc = store_open(argv[1], STORE_READONLY, NULL, 0, &env, &m);
    if (rc) {
        fprintf(stderr, "index_dump: %s: %s\n", argv[1], m.text);
        return 1;
    }
    idx_reader r;
    if ((rc = idx_reader_open(env, &r, &m)) || !r.trained) {
        fprintf(stderr, "index_dump: %s: %s\n", argv[1], rc ? m.text : "not trained");
        store_close(env);
        return 1;
    }
    if (mkdir(argv[2], 0777) != 0 && errno != EEXIST) {
        perror(argv[2]);
        return 1;
    }
    char path[4096], err[512];
    FILE *ids = NULL;
    snprintf(path, sizeof path, "%s/ids.txt", argv[2]);
    if (!(ids = fopen(path, "w"))) {
        perror(path);
        return 1;
    }
    int32_t *codes = NULL, *lens = NULL;
    float *dec = NULL;
    size_t ncap = 0, lcap = 0, dcap = 0, T = 0, N = 0;
    store_cursor *cur = NULL;
    uint32_t docno;
    kern_pdoc d;
    while ((rc = idx_reader_next_doc(&r, &cur, &docno, &d, &m)) == 1) {
        if (grow((void **)&codes, &ncap, T + d.ntok, sizeof *codes) ||
            grow((void **)&lens, &lcap, N + 1, sizeof *lens)) {
            fprintf(stderr, "index_dump: out of memory\n");
            return 1;
        }
        if (decomp) {
            if (grow((void **)&dec, &dcap, (T + d.ntok) * r.h.dim, sizeof *dec)) {
                fprintf(stderr, "index_dump: out of memory\n");
                return 1;
            }
            idx_reader_decompress(&r, &d, dec + T * r.h.dim);
        }
        for (uint32_t t = 0; t < d.ntok; t++)
            codes[T + t] = r.h.code_bytes == 2 ? ((const uint16_t *)d.codes)[t]
                                               : (int32_t)((const uint32_t *)d.codes)[t];
        T += d.ntok;
        lens[N++] = (int32_t)d.ntok;
        const char *id;
        size_t idlen;
        if (idx_reader_name(&r, docno, &id, &idlen, &m) == 0)
            fprintf(ids, "%.*s\n", (int)idlen, id);
        else
            fprintf(ids, "#%u\n", docno);
    }
    if (rc < 0 || rc > 1) {
        fprintf(stderr, "index_dump: %s\n", m.text);
        return 1;
    }
    fclose(ids);
    size_t shape[2] = {r.h.n_centroids, r.h.dim};
    snprintf(path, sizeof path, "%s/centroids.npy", argv[2]);
    if (tool_npy_save(path, TOOL_F32, 2, shape, r.centroids, err, sizeof err))
        goto fail;
    shape[0] = T;
    snprintf(path, sizeof path, "%s/codes.npy", argv[2]);
    if (tool_npy_save(path, TOOL_I32, 1, shape, codes, err, sizeof err))
        goto fail;
    if (decomp) {
        size_t dshape[2] = {T, r.h.dim};
        snprintf(path, sizeof path, "%s/decompressed.npy", argv[2]);
        if (tool_npy_save(path, TOOL_F32, 2, dshape, dec, err, sizeof err))
            goto fail;
    }
    shape[0] = N;
    snprintf(path, sizeof path, "%s/doclens.npy", argv[2]);
    if (tool_npy_save(path, TOOL_I32, 1, shape, lens, err, sizeof err))
        goto fail;
    printf("%zu documents, %zu tokens, %u centroids of dim %u\n", N, T, r.h.n_centroids, r.h.dim);
    if (r.axes)
        printf("axes code, %u / %u / %u / %u axes at 8 / 4 / 2 / 1 bits, levels %s\n", r.axes->n8,
               r.axes->n4, r.axes->n2, r.axes->n1,
               r.axes_additive ? "additive in the bits (the GPU's bit-plane kernels)"
                               : "not additive (the GPU's table kernels)");
    idx_reader_close(&r);
    store_close(env);
    free(codes);
    free(lens);
    free(dec);
    return 0;
fail:
    fprintf(stderr, "index_dump: %s\n", err);
    return 1;
}
