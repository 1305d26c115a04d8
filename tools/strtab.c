/* strtab.c: interned strings with dense numbers (see strtab.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "strtab.h"

/* Key copies are carved from blocks of this size (or one block per larger key), so that a
 * million short ids cost a few dozen allocations, not a million. */
#define ARENA_BLOCK ((size_t)1 << 20)

/* FNV-1a, 64 bits: short ids hash well enough and nothing here is adversarial beyond a slow
 * lookup. */
static uint64_t hash(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static int same(const char *key, const char *s, size_t len)
{
    return !memcmp(key, s, len) && key[len] == '\0';
}

long tool_strtab_find(const tool_strtab *t, const char *s, size_t len)
{
    if (!t->nslots)
        return -1;
    size_t mask = t->nslots - 1;
    for (size_t i = (size_t)hash(s, len) & mask;; i = (i + 1) & mask) {
        size_t v = t->slots[i];
        if (!v)
            return -1;
        if (same(t->keys[v - 1], s, len))
            return (long)(v - 1);
    }
}

static int grow_slots(tool_strtab *t)
{
    size_t n = t->nslots ? t->nslots * 2 : 64;
    size_t *slots = calloc(n, sizeof *slots);
    if (!slots)
        return -1;
    for (size_t k = 0; k < t->n; k++) {
        size_t i = (size_t)hash(t->keys[k], strlen(t->keys[k])) & (n - 1);
        while (slots[i])
            i = (i + 1) & (n - 1);
        slots[i] = k + 1;
    }
    free(t->slots);
    t->slots = slots;
    t->nslots = n;
    return 0;
}

static char *copy_key(tool_strtab *t, const char *s, size_t len)
{
    if (t->arena_cap - t->arena_used < len + 1) {
        size_t cap = len + 1 > ARENA_BLOCK ? len + 1 : ARENA_BLOCK;
        char **blocks = realloc(t->blocks, (t->nblocks + 1) * sizeof *blocks);
        if (!blocks)
            return NULL;
        t->blocks = blocks;
        char *b = malloc(cap);
        if (!b)
            return NULL;
        t->blocks[t->nblocks++] = b;
        t->arena = b;
        t->arena_used = 0;
        t->arena_cap = cap;
    }
    char *k = t->arena + t->arena_used;
    memcpy(k, s, len);
    k[len] = '\0';
    t->arena_used += len + 1;
    return k;
}

long tool_strtab_intern(tool_strtab *t, const char *s, size_t len, int *added)
{
    long found = tool_strtab_find(t, s, len);
    if (added)
        *added = found < 0;
    if (found >= 0)
        return found;
    if (2 * (t->n + 1) > t->nslots && grow_slots(t) < 0)
        return -1;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        char **keys = realloc(t->keys, cap * sizeof *keys);
        if (!keys)
            return -1;
        t->keys = keys;
        t->cap = cap;
    }
    char *k = copy_key(t, s, len);
    if (!k)
        return -1;
    size_t mask = t->nslots - 1;
    size_t i = (size_t)hash(s, len) & mask;
    while (t->slots[i])
        i = (i + 1) & mask;
    t->keys[t->n] = k;
    t->slots[i] = ++t->n;
    return (long)(t->n - 1);
}

void tool_strtab_free(tool_strtab *t)
{
    for (size_t i = 0; i < t->nblocks; i++)
        free(t->blocks[i]);
    free(t->blocks);
    free(t->keys);
    free(t->slots);
    memset(t, 0, sizeof *t);
}
