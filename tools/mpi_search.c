/*
 * mpi_search.c: `tartan-mpi search INDEX --queries Q.npy ...`: `tartan search` (same options,
 * same TREC or JSONL output, tools/cmd_search.c) over the shards of a sharded index. Rank 0
 * runs the command with a backend (search_run.h) that broadcasts each batch of queries, and
 * the search parameters when they change, to every rank; each rank searches its own shard (on
 * the CPU or its own GPU) with the same parameters, k results a query; rank 0 gathers the
 * ranks' results and merges them (tartan_results_merge) into the corpus's top k. The other
 * ranks serve: they wait for rank 0's messages until it says stop.
 *
 * Messages, each a broadcast from rank 0: a header {kind, bytes} then the bytes.
 *   OPEN    the index path: every rank opens its shard; rank 0 gathers each rank's code,
 *           message and tartan_index_info;
 *   PARAMS  the tartan_search_params as bytes (every rank runs this very build, so the struct
 *           is laid out alike), then the subset's ids one after another, each NUL-terminated;
 *   SEARCH  a batch of queries (header of u64s, lengths, embeddings), numbered in the order
 *           sent; every rank searches it at once (SEARCH_ASYNC: queues it for its two search
 *           threads and goes on to the next message);
 *   COLLECT batch number n, in the header's second word, no bytes: every rank answers batch
 *           n with its results (or its failure) through one gather;
 *   STOP    every rank closes its shard and returns.
 *
 * Two batches in flight: where the command keeps two (a GPU search, cmd_search.c), rank 0's two
 * search threads each send their batch, search rank 0's share and collect, taking turns at MPI
 * (MPI_THREAD_SERIALIZED; one batch in flight where MPI gives less), and the other ranks search
 * the two batches on two threads of their own while their main thread takes the next messages.
 * Why: with one batch in flight a rank's GPU idled through the broadcast, the gather, rank 0's
 * merge and each search's work on the host (2 replicas on 2 H200s: 1.66x one rank, of 1.72 s
 * only 1.35 s in the searches).
 *
 * Replicas: an index of S shards searched by P ranks, S dividing P (S < P), gives rank r shard
 * r % S; the ranks of replica group g = r / S each search share g of every batch (P / S
 * contiguous shares), and rank 0 merges each query's hits from its group's S ranks. Why: with
 * shards alone every rank repeats a query's work that does not shrink with the documents (the
 * probe of every centroid, the exact scores its own top k needs), so two ranks on two GPUs
 * answered no faster than one (0.98x at 2M documents on two H200s); replicas divide the
 * queries instead, as the copies of one process over several GPUs do (engine/gpus.h). Only
 * search takes replicas; build, add, delete, info and check want one rank a shard.
 */
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "mpi_commands.h"
#include "mpi_util.h"
#include "search_run.h"
#include "tartan.h"

enum { MSG_OPEN = 1, MSG_PARAMS, MSG_SEARCH, MSG_STOP, MSG_SEARCH_ASYNC, MSG_COLLECT };

/* What a rank holds between messages. */
typedef struct shard_state {
    tartan_db *db;
    tartan_search_params p;
    char *subset_text;       /* the subset's ids, NUL-separated */
    const char **subset_ids; /* pointers into it */
    char err[1400];          /* rank 0: the last failure, with the code's name first */
    int have_params, stopped;
    int n_shards; /* S: shards of the index (the ranks, or a divisor of them: replicas) */
    /* Rank 0: MPI taken in turns by its search threads (mpi_mu); the parameters sent once
     * and err written under state_mu; batches numbered as sent; two in flight or one. */
    pthread_mutex_t mpi_mu, state_mu;
    uint64_t sent;
    int async;
} shard_state;

/* Replica group g's share of n queries: [lo, hi). */
static void share_of(size_t n, int g, int groups, size_t *lo, size_t *hi)
{
    *lo = n * (size_t)g / (size_t)groups;
    *hi = n * (size_t)(g + 1) / (size_t)groups;
}

static void send_header(uint64_t kind, uint64_t bytes)
{
    uint64_t h[2] = {kind, bytes};
    MPI_Bcast(h, 2, MPI_UINT64_T, 0, MPI_COMM_WORLD);
}

/* ---- byte strings ------------------------------------------------------------------------- */

typedef struct wbuf {
    char *p;
    size_t len, cap;
    int oom;
} wbuf;

static void put(wbuf *b, const void *x, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, x, n);
    b->len += n;
}

static void put64(wbuf *b, uint64_t v)
{
    put(b, &v, sizeof v);
}

typedef struct rbuf {
    const char *p;
    size_t len, at;
    int bad;
} rbuf;

static const void *take(rbuf *b, size_t n)
{
    if (b->bad || n > b->len - b->at) {
        b->bad = 1;
        return NULL;
    }
    const void *x = b->p + b->at;
    b->at += n;
    return x;
}

static uint64_t take64(rbuf *b)
{
    uint64_t v = 0;
    const void *x = take(b, sizeof v);
    if (x)
        memcpy(&v, x, sizeof v);
    return v;
}

static size_t dtype_size(tartan_dtype t)
{
    return t == TARTAN_FLOAT32 ? 4 : 2;
}

/* ---- queries and results on the wire ------------------------------------------------------ */

static void put_queries(wbuf *b, const tartan_queries *q)
{
    put64(b, q->n_queries);
    put64(b, q->qlen);
    put64(b, q->n_rows);
    put64(b, q->dim);
    put64(b, (uint64_t)q->dtype);
    put64(b, q->qlens != NULL);
    if (q->qlens)
        for (size_t i = 0; i < q->n_queries; i++)
            put64(b, q->qlens[i]);
    put(b, q->embeddings, q->n_rows * q->dim * dtype_size(q->dtype));
}

/* Fills q pointing into b; *qlens allocated when the queries have lengths. */
static int take_queries(rbuf *b, tartan_queries *q, size_t **qlens)
{
    memset(q, 0, sizeof *q);
    *qlens = NULL;
    q->n_queries = (size_t)take64(b);
    q->qlen = (size_t)take64(b);
    q->n_rows = (size_t)take64(b);
    q->dim = (size_t)take64(b);
    q->dtype = (tartan_dtype)take64(b);
    if (take64(b)) {
        if (!(*qlens = malloc((q->n_queries ? q->n_queries : 1) * sizeof **qlens)))
            return ENOMEM;
        for (size_t i = 0; i < q->n_queries; i++)
            (*qlens)[i] = (size_t)take64(b);
        q->qlens = *qlens;
    }
    q->embeddings = take(b, q->n_rows * q->dim * dtype_size(q->dtype));
    return b->bad ? TARTAN_EINVAL : 0;
}

/* A rank's answer: its code and message, then (on success) its results. */
static void put_answer(wbuf *b, int rc, const char *msg, const tartan_results *r)
{
    put64(b, (uint64_t)(int64_t)rc);
    uint64_t ml = msg ? strlen(msg) : 0;
    put64(b, ml);
    put(b, msg, ml);
    if (rc)
        return;
    put64(b, r->n_queries);
    put(b, &r->stats, sizeof r->stats);
    for (size_t i = 0; i < r->n_queries; i++)
        put64(b, r->counts[i]);
    for (size_t h = 0; h < r->offsets[r->n_queries]; h++) {
        uint64_t l = strlen(r->hits[h].id);
        put(b, &r->hits[h].score, sizeof(float));
        put64(b, l);
        put(b, r->hits[h].id, l + 1);
    }
}

/* A result set built from an answer: ids point into the answer's bytes. */
typedef struct part {
    tartan_results r;
    size_t *counts, *offsets;
    tartan_hit *hits;
} part;

static void part_free(part *p)
{
    free(p->counts);
    free(p->offsets);
    free(p->hits);
}

/* A replica's answer for its share [lo, hi) of a batch of nq queries, as an answer for the
 * whole batch (no hits outside its share), so that every rank's answer merges alike. 0, or 1
 * for an answer of another size or no memory. */
static int spread_share(part *p, size_t nq, int g, int groups)
{
    size_t lo, hi;
    share_of(nq, g, groups, &lo, &hi);
    if (p->r.n_queries != hi - lo)
        return 1;
    size_t *counts = malloc((nq ? nq : 1) * sizeof *counts);
    size_t *offsets = malloc((nq + 1) * sizeof *offsets);
    if (!counts || !offsets) {
        free(counts);
        free(offsets);
        return 1;
    }
    size_t at = 0;
    for (size_t i = 0; i < nq; i++) {
        counts[i] = i >= lo && i < hi ? p->counts[i - lo] : 0;
        offsets[i] = at;
        at += counts[i];
    }
    offsets[nq] = at;
    free(p->counts);
    free(p->offsets);
    p->counts = counts;
    p->offsets = offsets;
    p->r.n_queries = nq;
    p->r.counts = counts;
    p->r.offsets = offsets;
    return 0;
}

static int take_answer(rbuf *b, part *p, int *rc, char *msg, size_t msglen)
{
    memset(p, 0, sizeof *p);
    *rc = (int)(int64_t)take64(b);
    uint64_t ml = take64(b);
    const char *m = take(b, ml);
    if (m)
        snprintf(msg, msglen, "%.*s", (int)ml, m);
    if (b->bad || *rc)
        return b->bad;
    size_t nq = (size_t)take64(b);
    const void *st = take(b, sizeof p->r.stats);
    if (b->bad || nq > b->len / 8)
        return 1;
    memcpy(&p->r.stats, st, sizeof p->r.stats);
    p->counts = malloc((nq ? nq : 1) * sizeof *p->counts);
    p->offsets = malloc((nq + 1) * sizeof *p->offsets);
    size_t total = 0;
    if (!p->counts || !p->offsets)
        return 1;
    for (size_t i = 0; i < nq; i++) {
        p->counts[i] = (size_t)take64(b);
        p->offsets[i] = total;
        total += p->counts[i];
    }
    p->offsets[nq] = total;
    if (b->bad || total > b->len / 13 || !(p->hits = malloc((total ? total : 1) * sizeof *p->hits)))
        return 1;
    for (size_t h = 0; h < total && !b->bad; h++) {
        const void *s = take(b, sizeof(float));
        uint64_t l = take64(b);
        const char *id = take(b, l + 1);
        if (!s || !id || id[l])
            return 1;
        memcpy(&p->hits[h].score, s, sizeof(float));
        p->hits[h].id = id;
    }
    p->r.n_queries = nq;
    p->r.counts = p->counts;
    p->r.offsets = p->offsets;
    p->r.hits = p->hits;
    return b->bad;
}

/* Every rank's answer to rank 0: there *all (malloc'd) and the byte counts and offsets. */
static int gather_answers(const wbuf *mine, char **all, int **lens, int **offs)
{
    int p = tool_mpi_size, len = mine->len > INT_MAX ? -1 : (int)mine->len;
    *all = NULL;
    *lens = tool_mpi_rank == 0 ? calloc((size_t)p, sizeof **lens) : NULL;
    *offs = tool_mpi_rank == 0 ? calloc((size_t)p, sizeof **offs) : NULL;
    MPI_Gather(&len, 1, MPI_INT, *lens, 1, MPI_INT, 0, MPI_COMM_WORLD);
    int bad = 0;
    if (tool_mpi_rank == 0) {
        size_t total = 0;
        for (int r = 0; r < p; r++) {
            if ((*lens)[r] < 0 || total > (size_t)INT_MAX)
                bad = 1;
            (*offs)[r] = (int)total;
            total += (size_t)((*lens)[r] > 0 ? (*lens)[r] : 0);
        }
        if (!bad && !(*all = malloc(total ? total : 1)))
            bad = 1;
    }
    MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (bad)
        return ENOMEM;
    MPI_Gatherv(mine->p, len, MPI_BYTE, *all, *lens, *offs, MPI_BYTE, 0, MPI_COMM_WORLD);
    return 0;
}

/* ---- every rank: the handlers ------------------------------------------------------------- */

static int handle_open(shard_state *s, const char *path, tartan_index_info *info, char *err,
                       size_t errlen)
{
    tartan_options o;
    tartan_options_init(&o);
    o.flags = TARTAN_READONLY;
    memset(info, 0, sizeof *info);
    int rc = tool_mpi_open_search_shard(path, &o, &s->db, &s->n_shards, err, errlen);
    if (!rc && (rc = tartan_info(s->db, info)))
        tool_fail(err, errlen, rc, "%s", tool_mpi_detail(tartan_errmsg(s->db)));
    return rc;
}

static int handle_params(shard_state *s, const char *bytes, size_t len)
{
    free(s->subset_text);
    free(s->subset_ids);
    s->subset_text = NULL;
    s->subset_ids = NULL;
    s->have_params = 0;
    if (len < sizeof s->p)
        return TARTAN_EINVAL;
    memcpy(&s->p, bytes, sizeof s->p);
    if (s->p.subset) {
        size_t tl = len - sizeof s->p;
        s->subset_text = malloc(tl + 1);
        s->subset_ids = malloc((s->p.n_subset ? s->p.n_subset : 1) * sizeof *s->subset_ids);
        if (!s->subset_text || !s->subset_ids)
            return ENOMEM;
        memcpy(s->subset_text, bytes + sizeof s->p, tl);
        s->subset_text[tl] = 0;
        const char *at = s->subset_text;
        for (size_t i = 0; i < s->p.n_subset; i++) {
            if (at >= s->subset_text + tl)
                return TARTAN_EINVAL;
            s->subset_ids[i] = at;
            at += strlen(at) + 1;
        }
        s->p.subset = s->subset_ids;
    }
    s->have_params = 1;
    return 0;
}

/* Searches this rank's shard for a batch (its replica group's share of it): the answer's
 * bytes in *out, a failure's code and message included. */
static void answer_search(const shard_state *s, const char *bytes, size_t len, wbuf *out)
{
    rbuf in = {bytes, len, 0, 0};
    tartan_queries q;
    size_t *qlens = NULL;
    tartan_results *r = NULL;
    char msg[1400] = "";
    int rc = take_queries(&in, &q, &qlens);
    size_t lo = 0, hi = q.n_queries;
    const int groups = s->n_shards > 0 ? tool_mpi_size / s->n_shards : 1;
    if (!rc && groups > 1) {
        /* This replica group's share of the batch. */
        share_of(q.n_queries, tool_mpi_rank / s->n_shards, groups, &lo, &hi);
        size_t row0 = lo * q.qlen, rows = (hi - lo) * q.qlen;
        if (q.qlens) {
            row0 = rows = 0;
            for (size_t i = 0; i < hi; i++)
                *(i < lo ? &row0 : &rows) += q.qlens[i];
            q.qlens += lo;
        }
        q.embeddings = (const char *)q.embeddings + row0 * q.dim * dtype_size(q.dtype);
        q.n_rows = rows;
        q.n_queries = hi - lo;
    }
    if (rc)
        snprintf(msg, sizeof msg, "a malformed batch of queries reached this rank");
    else if (!s->have_params)
        snprintf(msg, sizeof msg, "no search parameters reached this rank"), rc = TARTAN_EINVAL;
    else if (lo < hi && (rc = tartan_search(s->db, &q, &s->p, &r)))
        snprintf(msg, sizeof msg, "%s", tartan_errmsg(s->db));
    *out = (wbuf){0};
    static const size_t no_offsets[1] = {0};
    static const tartan_results none = {.offsets = no_offsets}; /* a share of no queries */
    put_answer(out, rc, msg, lo < hi || rc ? r : &none);
    tartan_results_free(r);
    free(qlens);
    if (out->oom) {
        free(out->p);
        *out = (wbuf){0};
        put_answer(out, ENOMEM, "ENOMEM: out of memory for the results", NULL);
    }
}

/* ---- ranks 1 .. P-1: the batches in flight ----------------------------------------------- */

/* A batch this rank was sent, until collected. */
typedef struct job {
    uint64_t n; /* its number */
    char *bytes;
    size_t len;
    wbuf out; /* the answer, once ready */
    int ready;
    struct job *next;
} job;

/* The batches in flight and the two threads that search the queued ones in turn. */
typedef struct pool {
    shard_state *s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *head, *tail, *todo; /* todo: the first not yet taken by a thread */
    uint64_t received;
    pthread_t th[2];
    int n_th, quit;
} pool;

static void *pool_thread(void *arg)
{
    pool *pl = arg;
    pthread_mutex_lock(&pl->mu);
    for (;;) {
        while (!pl->quit && !pl->todo)
            pthread_cond_wait(&pl->cv, &pl->mu);
        if (!pl->todo)
            break;
        job *j = pl->todo;
        pl->todo = j->next;
        pthread_mutex_unlock(&pl->mu);
        answer_search(pl->s, j->bytes, j->len, &j->out);
        pthread_mutex_lock(&pl->mu);
        j->ready = 1;
        pthread_cond_broadcast(&pl->cv);
    }
    pthread_mutex_unlock(&pl->mu);
    return NULL;
}

/* A batch received: searched now, or queued for the threads (started on the first). */
static int pool_add(pool *pl, char *bytes, size_t len, int async)
{
    job *j = calloc(1, sizeof *j);
    if (!j)
        return ENOMEM;
    j->n = pl->received++;
    j->bytes = bytes;
    j->len = len;
    if (!async) {
        answer_search(pl->s, bytes, len, &j->out);
        j->ready = 1;
    }
    pthread_mutex_lock(&pl->mu);
    if (pl->tail)
        pl->tail->next = j;
    else
        pl->head = j;
    pl->tail = j;
    if (async && !pl->todo)
        pl->todo = j;
    while (async && pl->n_th < 2 && pthread_create(&pl->th[pl->n_th], NULL, pool_thread, pl) == 0)
        pl->n_th++;
    if (async && pl->n_th == 0) { /* no thread: search it here */
        pl->todo = j->next;
        pthread_mutex_unlock(&pl->mu);
        answer_search(pl->s, bytes, len, &j->out);
        pthread_mutex_lock(&pl->mu);
        j->ready = 1;
    }
    pthread_cond_broadcast(&pl->cv);
    pthread_mutex_unlock(&pl->mu);
    return 0;
}

/* Batch n's answer to rank 0, once searched (a malformed request gets a failure as answer). */
static int pool_collect(pool *pl, uint64_t n)
{
    pthread_mutex_lock(&pl->mu);
    job **at = &pl->head, *prev = NULL;
    while (*at && (*at)->n != n)
        prev = *at, at = &(*at)->next;
    job *j = *at;
    while (j && !j->ready)
        pthread_cond_wait(&pl->cv, &pl->mu);
    if (j) {
        *at = j->next;
        if (pl->tail == j)
            pl->tail = prev;
    }
    pthread_mutex_unlock(&pl->mu);
    wbuf out = {0};
    if (j)
        out = j->out;
    else
        put_answer(&out, ENOMEM, "ENOMEM: this rank had no memory for the batch", NULL);
    char *all;
    int *lens, *offs;
    int grc = gather_answers(&out, &all, &lens, &offs);
    free(out.p);
    if (j)
        free(j->bytes);
    free(j);
    return grc;
}

/* Waits until every batch received is searched (before the parameters or the shard change). */
static void pool_drain(pool *pl)
{
    pthread_mutex_lock(&pl->mu);
    for (;;) {
        int busy = 0;
        for (job *j = pl->head; j; j = j->next)
            busy |= !j->ready;
        if (!busy)
            break;
        pthread_cond_wait(&pl->cv, &pl->mu);
    }
    pthread_mutex_unlock(&pl->mu);
}

static void pool_end(pool *pl)
{
    pool_drain(pl);
    pthread_mutex_lock(&pl->mu);
    pl->quit = 1;
    pthread_cond_broadcast(&pl->cv);
    pthread_mutex_unlock(&pl->mu);
    for (int i = 0; i < pl->n_th; i++)
        pthread_join(pl->th[i], NULL);
    while (pl->head) {
        job *j = pl->head;
        pl->head = j->next;
        free(j->bytes);
        free(j->out.p);
        free(j);
    }
}

static void handle_stop(shard_state *s)
{
    tartan_close(s->db);
    s->db = NULL;
    free(s->subset_text);
    free(s->subset_ids);
    s->subset_text = NULL;
    s->subset_ids = NULL;
    s->stopped = 1;
}

/* Ranks 1 .. P-1: serve rank 0's messages until STOP. */
static int serve(void)
{
    shard_state s = {0};
    pool pl = {.s = &s};
    pthread_mutex_init(&pl.mu, NULL);
    pthread_cond_init(&pl.cv, NULL);
    int status = 0;
    while (!s.stopped) {
        uint64_t h[2];
        MPI_Bcast(h, 2, MPI_UINT64_T, 0, MPI_COMM_WORLD);
        if (h[0] == MSG_COLLECT) {
            if (pool_collect(&pl, h[1]))
                status = 1;
            continue;
        }
        char *bytes = malloc(h[1] + 1);
        int oom = bytes == NULL;
        if (tool_mpi_any(oom)) { /* rank 0 takes part in this vote too */
            free(bytes);
            pool_end(&pl);
            handle_stop(&s);
            return 1;
        }
        tool_mpi_bcast(bytes, h[1], 0);
        bytes[h[1]] = 0;
        if (h[0] == MSG_SEARCH || h[0] == MSG_SEARCH_ASYNC) {
            /* The job owns the bytes from here (a failure to queue answers when collected). */
            if (pool_add(&pl, bytes, h[1], h[0] == MSG_SEARCH_ASYNC)) {
                free(bytes);
                pl.received++;
            }
            continue;
        }
        pool_drain(&pl); /* the parameters and the shard stay as the searches saw them */
        switch (h[0]) {
        case MSG_OPEN: {
            tartan_index_info info;
            char err[1400] = "";
            int rc = handle_open(&s, bytes, &info, err, sizeof err);
            int64_t rc64 = rc;
            MPI_Gather(&rc64, 1, MPI_INT64_T, NULL, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
            MPI_Gather(&info, (int)sizeof info, MPI_BYTE, NULL, (int)sizeof info, MPI_BYTE, 0,
                       MPI_COMM_WORLD);
            MPI_Gather(&s.n_shards, 1, MPI_INT, NULL, 1, MPI_INT, 0, MPI_COMM_WORLD);
            char **t = tool_mpi_gather_text(err);
            (void)t;
            status = rc != 0;
            break;
        }
        case MSG_PARAMS: {
            int rc = handle_params(&s, bytes, h[1]);
            MPI_Gather(&rc, 1, MPI_INT, NULL, 1, MPI_INT, 0, MPI_COMM_WORLD);
            break;
        }
        default:
            handle_stop(&s);
        }
        free(bytes);
    }
    pool_end(&pl);
    pthread_cond_destroy(&pl.cv);
    pthread_mutex_destroy(&pl.mu);
    return status;
}

/* ---- rank 0: the backend ------------------------------------------------------------------ */

/* Sends a message: header and bytes; the ranks vote on having the memory for it. */
static int send_msg(uint64_t kind, const void *bytes, size_t len)
{
    send_header(kind, len);
    if (tool_mpi_any(0))
        return ENOMEM;
    tool_mpi_bcast((void *)bytes, len, 0);
    return 0;
}

static int be_open(void *ctx, const char *path, tartan_index_info *info)
{
    shard_state *s = ctx;
    if (send_msg(MSG_OPEN, path, strlen(path))) {
        snprintf(s->err, sizeof s->err, "ENOMEM: a rank is out of memory");
        return ENOMEM;
    }
    char err[1400] = "";
    int rc = handle_open(s, path, info, err, sizeof err);
    int p = tool_mpi_size;
    int64_t rc64 = rc, *rcs = calloc((size_t)p, sizeof *rcs);
    tartan_index_info *infos = calloc((size_t)p, sizeof *infos);
    MPI_Gather(&rc64, 1, MPI_INT64_T, rcs, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    MPI_Gather(info, (int)sizeof *info, MPI_BYTE, infos, (int)sizeof *info, MPI_BYTE, 0,
               MPI_COMM_WORLD);
    int *ns = calloc((size_t)p, sizeof *ns);
    MPI_Gather(&s->n_shards, 1, MPI_INT, ns, 1, MPI_INT, 0, MPI_COMM_WORLD);
    char **texts = tool_mpi_gather_text(err);
    rc = 0;
    size_t at = 0;
    for (int r = 0; r < p; r++) {
        if (rcs[r] && !rc) {
            rc = (int)rcs[r];
            const char *name = tartan_err_name(rc);
            at = (size_t)snprintf(s->err, sizeof s->err, "%s: rank %d: %s", name ? name : "error",
                                  r, texts[r]);
        } else if (rcs[r] && at < sizeof s->err) {
            at += (size_t)snprintf(s->err + at, sizeof s->err - at, "; rank %d: %s", r, texts[r]);
        }
    }
    /* Every rank must see the same shards (one host, or the same copies on every host). */
    for (int r = 1; r < p && !rc; r++)
        if (!ns || ns[r] != s->n_shards) {
            rc = TARTAN_ENOINDEX;
            snprintf(s->err, sizeof s->err,
                     "TARTAN_ENOINDEX: rank %d sees %d shards in '%s', rank 0 %d", r,
                     ns ? ns[r] : -1, path, s->n_shards);
        }
    free(ns);
    /* The corpus's description: shard 0's shape, the shards' counts summed (one replica of
     * each: ranks 0 .. S - 1). */
    for (int r = 1; r < s->n_shards && !rc; r++) {
        if (infos[r].dim != infos[0].dim && infos[r].n_centroids) {
            rc = TARTAN_EDIM;
            snprintf(s->err, sizeof s->err, "TARTAN_EDIM: shard %d has dimension %u, shard 0 %u", r,
                     infos[r].dim, infos[0].dim);
        }
        info->n_docs += infos[r].n_docs;
        info->n_tokens += infos[r].n_tokens;
    }
    for (int r = 0; r < p; r++)
        free(texts[r]);
    free(texts);
    free(rcs);
    free(infos);
    return rc;
}

/* Rank 0's failure message, from either search thread (both may fail at once). */
static void set_err(shard_state *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&s->state_mu);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    pthread_mutex_unlock(&s->state_mu);
    va_end(ap);
}

/* Sends the parameters when they differ from those sent last (the command sets them once).
 * Under state_mu, which its messages are written under too. */
static int send_params(shard_state *s, const tartan_search_params *p)
{
    pthread_mutex_lock(&s->state_mu);
    int rc = 0;
    if (!s->have_params || memcmp(&s->p, p, sizeof *p)) {
        wbuf b = {0};
        put(&b, p, sizeof *p);
        for (size_t i = 0; p->subset && i < p->n_subset; i++)
            put(&b, p->subset[i], strlen(p->subset[i]) + 1);
        pthread_mutex_lock(&s->mpi_mu);
        rc = b.oom ? ENOMEM : send_msg(MSG_PARAMS, b.p, b.len);
        int worst = 0, *rcs = NULL;
        if (!rc) {
            int mine = 0;
            rcs = calloc((size_t)tool_mpi_size, sizeof *rcs);
            MPI_Gather(&mine, 1, MPI_INT, rcs, 1, MPI_INT, 0, MPI_COMM_WORLD);
        }
        pthread_mutex_unlock(&s->mpi_mu);
        free(b.p);
        for (int r = 0; rcs && r < tool_mpi_size && !worst; r++)
            worst = rcs[r];
        free(rcs);
        if (rc) {
            snprintf(s->err, sizeof s->err, "ENOMEM: out of memory for the search parameters");
        } else if (worst) {
            snprintf(s->err, sizeof s->err, "%s: a rank could not take the search parameters",
                     tartan_err_name(worst));
            s->have_params = 0;
            rc = worst;
        } else {
            /* memcpy, not assignment: the comparison above reads the padding too. The
             * caller's subset stays valid through the command. */
            memcpy(&s->p, p, sizeof *p);
            s->have_params = 1;
        }
    }
    pthread_mutex_unlock(&s->state_mu);
    return rc;
}

/* The ranks' answers to one batch merged into its results. */
static int merge_answers(shard_state *s, const tartan_queries *q, const tartan_search_params *p,
                         const char *all, const int *lens, const int *offs, tartan_results **res)
{
    int rc = 0, p_n = tool_mpi_size;
    part *parts = calloc((size_t)p_n, sizeof *parts);
    const tartan_results **pp = calloc((size_t)p_n, sizeof *pp);
    if (!parts || !pp) {
        rc = ENOMEM;
        set_err(s, "ENOMEM: out of memory for the ranks' results");
    }
    for (int r = 0; r < p_n && !rc; r++) {
        rbuf in = {all + offs[r], (size_t)lens[r], 0, 0};
        char msg[1200] = "";
        int rrc = 0;
        if (take_answer(&in, &parts[r], &rrc, msg, sizeof msg)) {
            rc = TARTAN_EINTERNAL;
            set_err(s, "TARTAN_EINTERNAL: rank %d's answer is malformed", r);
        } else if (rrc) {
            rc = rrc;
            const char *name = tartan_err_name(rrc);
            set_err(s, "%s: rank %d: %s", name ? name : "error", r, tool_mpi_detail(msg));
        }
        if (!rc && tool_mpi_size / s->n_shards > 1 &&
            spread_share(&parts[r], q->n_queries, r / s->n_shards, tool_mpi_size / s->n_shards)) {
            rc = TARTAN_EINTERNAL;
            set_err(s, "TARTAN_EINTERNAL: rank %d's answer does not fit its share", r);
        }
        pp[r] = &parts[r].r;
    }
    if (!rc && (rc = tartan_results_merge(pp, (size_t)p_n, p->k, res)))
        set_err(s, "%s", tartan_errmsg(NULL));
    for (int r = 0; parts && r < p_n; r++)
        part_free(&parts[r]);
    free(parts);
    free(pp);
    return rc;
}

/* One batch: sent to every rank, rank 0's share searched here, every rank's answer collected
 * and merged. Two threads may be in here at once (s->async): MPI in turns. */
static int be_search(void *ctx, const tartan_queries *q, const tartan_search_params *p,
                     tartan_results **res)
{
    shard_state *s = ctx;
    *res = NULL;
    int rc = send_params(s, p);
    if (rc)
        return rc;
    wbuf b = {0};
    put_queries(&b, q);
    if (b.oom) {
        free(b.p);
        set_err(s, "ENOMEM: out of memory for the queries");
        return ENOMEM;
    }
    pthread_mutex_lock(&s->mpi_mu);
    rc = send_msg(s->async ? MSG_SEARCH_ASYNC : MSG_SEARCH, b.p, b.len);
    const uint64_t n = s->sent++;
    pthread_mutex_unlock(&s->mpi_mu);
    if (rc) {
        free(b.p);
        set_err(s, "ENOMEM: a rank is out of memory for the queries");
        return rc;
    }
    wbuf mine;
    answer_search(s, b.p, b.len, &mine);
    free(b.p);
    char *all = NULL;
    int *lens = NULL, *offs = NULL;
    pthread_mutex_lock(&s->mpi_mu);
    send_header(MSG_COLLECT, n);
    rc = gather_answers(&mine, &all, &lens, &offs);
    pthread_mutex_unlock(&s->mpi_mu);
    free(mine.p);
    if (rc)
        set_err(s, "ENOMEM: out of memory for the ranks' results");
    else
        rc = merge_answers(s, q, p, all, lens, offs, res);
    free(all);
    free(lens);
    free(offs);
    return rc;
}

static void be_inflight(void *ctx, int batches)
{
    ((shard_state *)ctx)->async = batches > 1;
}

static const char *be_errmsg(void *ctx)
{
    return ((shard_state *)ctx)->err;
}

static void be_close(void *ctx)
{
    shard_state *s = ctx;
    if (!s->stopped) {
        send_msg(MSG_STOP, "", 0);
        handle_stop(s);
    }
}

int tool_mpi_cmd_search(int argc, char **argv)
{
    if (tool_mpi_rank != 0)
        return serve();
    shard_state s = {0};
    pthread_mutex_init(&s.mpi_mu, NULL);
    pthread_mutex_init(&s.state_mu, NULL);
    /* Two batches in flight need MPI from two threads, in turns. */
    tool_search_backend be = {be_open, be_search,           be_errmsg,  be_close,
                              &s,      tool_mpi_serialized, be_inflight};
    int status = tool_search_run(argc, argv, &be);
    pthread_mutex_destroy(&s.mpi_mu);
    pthread_mutex_destroy(&s.state_mu);
    return status;
}
