/*
 * probe.h: the handle's probe table for the CPU search's stage 1 (engine/probe.c).
 */
#ifndef TARTAN_ENGINE_PROBE_H
#define TARTAN_ENGINE_PROBE_H

#include "index.h"
#include "kernels.h"
#include "tartan.h"

struct eng_probe;

/* The probe table of r's centroids, counted in use until eng_probe_put; NULL where the probe
 * is not usable (no AMX tiles, TARTAN_CPU_PROBE=fp32, an untrained index, no memory): the
 * search then computes the whole fp32 table. Any thread. */
struct eng_probe *eng_probe_get(tartan_db *db, const idx_reader *r);
const kern_probe_table *eng_probe_table(const struct eng_probe *p);
void eng_probe_put(tartan_db *db, struct eng_probe *p);
/* At tartan_close (no search running). */
void eng_probe_free(struct eng_probe *p);

#endif
