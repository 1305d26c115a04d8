/* status.c: the kernels' per-thread error text and thread count. */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>

#include "kernels_impl.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static _Thread_local char last_error[256];

void kern_set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
}

const char *kern_last_error(void)
{
    return last_error;
}

void kern_set_threads(int n)
{
#ifdef _OPENMP
    if (n > 0)
        omp_set_num_threads(n);
#else
    (void)n;
#endif
}

