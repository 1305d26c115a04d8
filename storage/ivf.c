/*
 * ivf.c: the inverted lists (database "ivf", FORMAT.md): for each centroid, the sorted set of
 * document numbers that have a token with that code, in blocks of up to STORE_IVF_BLOCK
 * numbers. A block stores the gaps between consecutive numbers bit-packed at the width of its
 * largest gap, under a key of (centroid, lower bound), with a CRC-32C: about 11 bits a number
 * where version 1 spent 32 plus LMDB's duplicate pages, and a change rewrites only the blocks
 * it touches. Readers decode a block at a time into the iterator's buffer.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"
#include "tartan.h"

static uint32_t block_crc(uint64_t key, const uint8_t *val, size_t size)
{
    uint32_t c = store_crc32c(0, &key, 8);
    return store_crc32c(c, val + 4, size - 4);
}

static unsigned bit_width(uint32_t x)
{
    return x ? 32u - (unsigned)__builtin_clz(x) : 0u;
}

int store_ivf_decode(uint64_t key, const void *vval, size_t size, int verify, uint32_t *out,
                     size_t *nout, store_msg *m)
{
    const uint8_t *val = vval;
    uint32_t c = (uint32_t)(key >> 32), lo = (uint32_t)key;
    if (size < STORE_IVF_HEAD)
        return store_fail(m, TARTAN_ECORRUPT,
                          "inverted list of centroid %u: block at %u of %zu bytes is truncated", c,
                          lo, size);
    if (verify) {
        uint32_t want, got = block_crc(key, val, size);
        memcpy(&want, val, 4);
        if (want != got)
            return store_fail(m, TARTAN_ECORRUPT,
                              "inverted list of centroid %u: block at %u: checksum mismatch "
                              "(stored %08x, computed %08x)",
                              c, lo, want, got);
    }
    uint16_t n;
    memcpy(&n, val + 4, 2);
    unsigned bits = val[6];
    if (n == 0 || n > STORE_IVF_BLOCK || bits > 32 ||
        size != STORE_IVF_HEAD + ((size_t)n * bits + 7) / 8)
        return store_fail(m, TARTAN_ECORRUPT,
                          "inverted list of centroid %u: block at %u is malformed (%u numbers of "
                          "%u bits in %zu bytes)",
                          c, lo, n, bits, size);
    const uint8_t *p = val + STORE_IVF_HEAD;
    uint64_t acc = 0, mask = bits == 32 ? 0xffffffffull : ((uint64_t)1 << bits) - 1;
    unsigned have = 0;
    uint64_t cur = lo;
    for (unsigned i = 0; i < n; i++) {
        while (have < bits) {
            acc |= (uint64_t)*p++ << have;
            have += 8;
        }
        uint64_t gap = acc & mask;
        acc >>= bits;
        have -= bits;
        cur += gap + (i > 0);
        if (cur > UINT32_MAX)
            return store_fail(m, TARTAN_ECORRUPT,
                              "inverted list of centroid %u: block at %u runs past the largest "
                              "document number",
                              c, lo);
        out[i] = (uint32_t)cur;
    }
    *nout = n;
    return 0;
}

int store_ivf_put_block(MDB_txn *txn, MDB_dbi dbi, uint64_t key, const uint32_t *docs, size_t n,
                        int append, store_msg *m)
{
    uint32_t lo = (uint32_t)key;
    unsigned bits = 0;
    for (size_t i = 0; i < n; i++)
        bits |= i == 0 ? docs[0] - lo : docs[i] - docs[i - 1] - 1;
    bits = bit_width(bits);
    MDB_val k = {sizeof key, &key}, d = {STORE_IVF_HEAD + (n * bits + 7) / 8, NULL};
    int rc = mdb_put(txn, dbi, &k, &d, MDB_RESERVE | (append ? MDB_APPEND : 0));
    if (rc)
        return store_map_lmdb(m, rc, "writing an inverted list");
    uint8_t *v = d.mv_data;
    uint16_t n16 = (uint16_t)n;
    memcpy(v + 4, &n16, 2);
    v[6] = (uint8_t)bits;
    v[7] = 0;
    uint8_t *p = v + STORE_IVF_HEAD;
    uint64_t acc = 0;
    unsigned have = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t gap = i == 0 ? docs[0] - lo : docs[i] - docs[i - 1] - 1;
        acc |= gap << have;
        have += bits;
        while (have >= 8) {
            *p++ = (uint8_t)acc;
            acc >>= 8;
            have -= 8;
        }
    }
    if (have)
        *p++ = (uint8_t)acc;
    uint32_t c = block_crc(key, v, d.mv_size);
    memcpy(v, &c, 4);
    return 0;
}

/* The block of centroid c's list that would hold doc (the greatest key at or below (c, doc)),
 * or its last block with doc UINT32_MAX. 0 with *key and the value; TARTAN_ENOTFOUND (no
 * message) when the list has no such block. */
static int block_find(store_txn *t, MDB_cursor *cur, uint32_t c, uint32_t doc, uint64_t *key,
                      MDB_val *d, store_msg *m)
{
    uint64_t want = store_ivf_key(c, doc);
    MDB_val k = {sizeof want, &want};
    int rc = store_cget(t, cur, &k, d, MDB_SET_RANGE);
    if (rc == MDB_NOTFOUND) {
        rc = store_cget(t, cur, &k, d, MDB_LAST);
    } else if (rc == 0) {
        uint64_t got = 0;
        if (k.mv_size == 8)
            memcpy(&got, k.mv_data, 8);
        if (got != want)
            rc = store_cget(t, cur, &k, d, MDB_PREV);
    }
    if (rc == MDB_NOTFOUND)
        return TARTAN_ENOTFOUND;
    if (rc)
        return store_map_lmdb(m, rc, "reading the inverted lists");
    if (k.mv_size != 8)
        return store_fail(m, TARTAN_ECORRUPT, "an inverted-list key has %zu bytes", k.mv_size);
    memcpy(key, k.mv_data, 8);
    if ((uint32_t)(*key >> 32) != c)
        return TARTAN_ENOTFOUND;
    return 0;
}

int store_ivf_append(store_txn *t, uint32_t c, const uint32_t *docs, size_t n, store_msg *m)
{
    t->st_dirty = 1;
    if (n == 0)
        return 0;
    MDB_cursor *cur;
    int rc = mdb_cursor_open(t->st_txn, t->st_gen->g_ivf, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening the inverted lists");
    uint32_t buf[2 * STORE_IVF_BLOCK];
    size_t have = 0, i = 0;
    uint64_t key;
    MDB_val d;
    rc = block_find(t, cur, c, UINT32_MAX, &key, &d, m);
    if (rc == 0) {
        /* Fill the list's last block first (its numbers are all below the new ones). */
        if ((rc = store_ivf_decode(key, d.mv_data, d.mv_size, 1, buf, &have, m)))
            goto out;
        if (docs[0] <= buf[have - 1]) {
            rc = store_fail(m, TARTAN_ECORRUPT,
                            "inverted list of centroid %u: document %u is not above its last, %u",
                            c, docs[0], buf[have - 1]);
            goto out;
        }
        if (have < STORE_IVF_BLOCK) {
            while (have < STORE_IVF_BLOCK && i < n)
                buf[have++] = docs[i++];
            if ((rc = store_ivf_put_block(t->st_txn, t->st_gen->g_ivf, key, buf, have, 0, m)))
                goto out;
        }
    } else if (rc != TARTAN_ENOTFOUND) {
        goto out;
    }
    rc = 0;
    while (i < n) {
        size_t take = n - i < STORE_IVF_BLOCK ? n - i : STORE_IVF_BLOCK;
        if ((rc = store_ivf_put_block(t->st_txn, t->st_gen->g_ivf, store_ivf_key(c, docs[i]),
                                      docs + i, take, 0, m)))
            goto out;
        i += take;
    }
out:
    mdb_cursor_close(cur);
    return rc;
}

int store_ivf_remove(store_txn *t, uint32_t c, const uint32_t *docs, size_t n, store_msg *m)
{
    t->st_dirty = 1;
    MDB_cursor *cur;
    int rc = mdb_cursor_open(t->st_txn, t->st_gen->g_ivf, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening the inverted lists");
    uint32_t buf[STORE_IVF_BLOCK];
    for (size_t i = 0; i < n && !rc;) {
        uint64_t key;
        MDB_val d;
        size_t have;
        rc = block_find(t, cur, c, docs[i], &key, &d, m);
        if (rc == TARTAN_ENOTFOUND) {
            rc = store_fail(m, TARTAN_ECORRUPT,
                            "inverted list of centroid %u does not list document %u", c, docs[i]);
            break;
        }
        if (rc || (rc = store_ivf_decode(key, d.mv_data, d.mv_size, 1, buf, &have, m)))
            break;
        /* Remove every requested number up to the block's last one: all must be there (the
         * next block's lower bound is above docs[i], so a number past this block's last is in
         * no block). */
        size_t end = i, w = 0, x = i;
        while (end < n && docs[end] <= buf[have - 1])
            end++;
        for (size_t r = 0; r < have; r++) {
            if (x < end && docs[x] == buf[r]) {
                x++;
                continue;
            }
            if (x < end && docs[x] < buf[r])
                break;
            buf[w++] = buf[r];
        }
        if (x < end || end == i) {
            rc = store_fail(m, TARTAN_ECORRUPT,
                            "inverted list of centroid %u does not list document %u", c, docs[x]);
            break;
        }
        i = end;
        if (w == 0) {
            MDB_val k = {sizeof key, &key};
            rc = mdb_del(t->st_txn, t->st_gen->g_ivf, &k, NULL);
            if (rc)
                rc = store_map_lmdb(m, rc, "updating the inverted lists");
        } else {
            rc = store_ivf_put_block(t->st_txn, t->st_gen->g_ivf, key, buf, w, 0, m);
        }
    }
    mdb_cursor_close(cur);
    return rc;
}

struct store_ivf_iter {
    store_txn *si_t;
    MDB_cursor *si_cur;
    uint32_t si_c;
    int si_state; /* 0: not started, 1: inside the list, 2: done */
    uint32_t si_buf[STORE_IVF_BLOCK];
};

int store_ivf_open(store_txn *t, uint32_t centroid, store_ivf_iter **out, store_msg *m)
{
    *out = NULL;
    store_ivf_iter *it = malloc(sizeof *it);
    if (!it)
        return store_fail(m, ENOMEM, "out of memory");
    int rc = mdb_cursor_open(t->st_txn, t->st_gen->g_ivf, &it->si_cur);
    if (rc) {
        free(it);
        return store_map_lmdb(m, rc, "opening the inverted lists");
    }
    it->si_c = centroid;
    it->si_t = t;
    it->si_state = 0;
    *out = it;
    return 0;
}

int store_ivf_next(store_ivf_iter *it, const uint32_t **docs, size_t *n, store_msg *m)
{
    if (it->si_state == 2)
        return 0;
    uint64_t want = store_ivf_key(it->si_c, 0);
    MDB_val k = {sizeof want, &want}, d;
    int rc = store_cget(it->si_t, it->si_cur, &k, &d, it->si_state == 0 ? MDB_SET_RANGE : MDB_NEXT);
    it->si_state = 1;
    if (rc == MDB_NOTFOUND) {
        it->si_state = 2;
        return 0;
    }
    if (rc)
        return store_map_lmdb(m, rc, "reading an inverted list");
    uint64_t key = 0;
    if (k.mv_size != 8)
        return store_fail(m, TARTAN_ECORRUPT, "an inverted-list key has %zu bytes", k.mv_size);
    memcpy(&key, k.mv_data, 8);
    if ((uint32_t)(key >> 32) != it->si_c) {
        /* The list ends where the next one begins: a sound block of a later centroid. A
         * damaged key inside the list (its block's checksum covers it) would otherwise end the
         * list early, silently. */
        size_t nn;
        if ((uint32_t)(key >> 32) < it->si_c)
            return store_fail(m, TARTAN_ECORRUPT,
                              "inverted list of centroid %u: a block of centroid %u follows it "
                              "(damaged key)",
                              it->si_c, (uint32_t)(key >> 32));
        if ((rc = store_ivf_decode(key, d.mv_data, d.mv_size, 1, it->si_buf, &nn, m)))
            return rc;
        it->si_state = 2;
        return 0;
    }
    if ((rc = store_ivf_decode(key, d.mv_data, d.mv_size, 1, it->si_buf, n, m)))
        return rc;
    *docs = it->si_buf;
    return 1;
}

void store_ivf_close(store_ivf_iter *it)
{
    if (!it)
        return;
    mdb_cursor_close(it->si_cur);
    free(it);
}

int store_ivf_count(store_txn *t, uint32_t centroid, size_t *n, store_msg *m)
{
    *n = 0;
    MDB_cursor *cur;
    int rc = mdb_cursor_open(t->st_txn, t->st_gen->g_ivf, &cur);
    if (rc)
        return store_map_lmdb(m, rc, "opening the inverted lists");
    uint64_t want = store_ivf_key(centroid, 0);
    MDB_val k = {sizeof want, &want}, d;
    MDB_cursor_op op = MDB_SET_RANGE;
    while ((rc = store_cget(t, cur, &k, &d, op)) == 0) {
        op = MDB_NEXT;
        uint64_t key = 0;
        if (k.mv_size == 8)
            memcpy(&key, k.mv_data, 8);
        if (k.mv_size != 8 || (uint32_t)(key >> 32) != centroid)
            break;
        uint16_t c = 0;
        if (d.mv_size >= STORE_IVF_HEAD)
            memcpy(&c, (const uint8_t *)d.mv_data + 4, 2);
        *n += c;
    }
    mdb_cursor_close(cur);
    return rc && rc != MDB_NOTFOUND ? store_map_lmdb(m, rc, "reading an inverted list") : 0;
}
