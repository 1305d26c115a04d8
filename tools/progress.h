/* progress.h: a one-line progress report on a terminal (done/total, rate, ETA), silent when
 * standard error is not a terminal. */
#ifndef TARTAN_TOOLS_PROGRESS_H
#define TARTAN_TOOLS_PROGRESS_H

#include <stddef.h>

typedef struct tool_progress {
    const char *what; /* "documents" */
    size_t total;
    double t0, last;
    int tty;
} tool_progress;

/* Starts a report of total items. Reports only if stderr is a terminal. */
void tool_progress_start(tool_progress *p, const char *what, size_t total);
/* Done items so far: redraws at most 4 times a second. */
void tool_progress_update(tool_progress *p, size_t done);
/* Final line (with a newline) on a terminal. */
void tool_progress_end(tool_progress *p, size_t done);
/* Seconds since an arbitrary fixed point (monotonic). */
double tool_now(void);

/* Whether TARTAN_KMEANS_TRACE (set, not "0") asks for the build's phase times on stderr; the
 * library reads the same variable for its own phases. */
int tool_trace(void);

#endif
