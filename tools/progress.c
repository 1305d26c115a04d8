/* progress.c: see progress.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "progress.h"

double tool_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int tool_trace(void)
{
    const char *e = getenv("TARTAN_KMEANS_TRACE");
    return e && *e && strcmp(e, "0") != 0;
}

void tool_progress_start(tool_progress *p, const char *what, size_t total)
{
    p->what = what;
    p->total = total;
    p->t0 = p->last = tool_now();
    p->tty = isatty(STDERR_FILENO);
}

static void draw(tool_progress *p, size_t done, int final)
{
    double el = tool_now() - p->t0;
    double rate = el > 0 ? (double)done / el : 0;
    double eta = rate > 0 ? (double)(p->total - (done < p->total ? done : p->total)) / rate : 0;
    unsigned e = (unsigned)(final ? el : eta);
    fprintf(stderr, "\r%zu/%zu %s (%3.0f%%)  %.0f %s/s  %s %u:%02u:%02u\033[K", done, p->total,
            p->what, p->total ? 100.0 * (double)done / (double)p->total : 100.0, rate, p->what,
            final ? "took" : "ETA", e / 3600, e / 60 % 60, e % 60);
    if (final)
        fputc('\n', stderr);
    fflush(stderr);
}

void tool_progress_update(tool_progress *p, size_t done)
{
    if (!p->tty)
        return;
    double now = tool_now();
    if (now - p->last < 0.25)
        return;
    p->last = now;
    draw(p, done, 0);
}

void tool_progress_end(tool_progress *p, size_t done)
{
    if (p->tty)
        draw(p, done, 1);
}
