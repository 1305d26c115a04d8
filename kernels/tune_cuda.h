/*
 * tune_cuda.h: overrides of the CUDA kernels' launch choices, for benchmarks that compare the
 * variants in one run (private to kernels/, its tests and bench/). 0 everywhere means
 * automatic, which is what the library uses; nothing else sets them.
 */
#ifndef TARTAN_TUNE_CUDA_H
#define TARTAN_TUNE_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kern_gpu_tuning {
    int residual_tiles; /* residual kernel: 8-token tiles in flight per warp, 2 or 4 */
    int residual_pipe;  /* residual kernel: 1 pipelined (the default), 2 not */
    int residual_ctas;  /* residual kernel: CTAs per SM its registers are fitted to, 3 (default) or
                           4;  one query with A in shared memory: 4 (default) or 5 */
    int residual_sched; /* residual kernel: 1 documents claimed from a counter (default), 2 grid stride */
    int residual_asmem; /* residual kernel, one query of <= 32 rows: 1 A in shared memory (default),
                           2 in registers (the batched calls' layout) */
    int i8_tiles;       /* int8 MaxSim kernel: 8-token tiles in flight per warp, 2 or 4 */
    int stream_tiles;   /* one-query warp kernel: 8-token tiles in flight per warp, 2 or 4 (default) */
    int stream_path;    /* one-query MaxSim: 1 the CTA-per-document kernel, 2 the warp-per-document
                           kernel (where it applies) */
    int wgmma_rows;     /* wgmma MaxSim: query rows per block, 128, 256 or 512 */
    int dense_path;     /* dense MaxSim, many query rows: 1 the mma.sync tile kernel, 2 the wgmma
                           kernel (sm_90; an error where it cannot run) */
    int residual_one;   /* residual kernel, one query of <= 32 rows, nbits 2, dim 64 or 128: 1 the
                           general kernel (shared-memory decode table, 4-byte q.C loads, 2 tiles,
                           pipelined, 4 CTAs an SM); byte-permute decode (ALU) or 16-byte q.C
                           loads (V): 2 ALU, 3 V, 4 ALU + V, 5 ALU + V with 4 tiles and no
                           pipeline, 6 ALU + V with 4 tiles, 7 ALU + V at 5 CTAs; 8 ALU with 4
                           tiles and no pipeline, 9 ALU with 4 tiles, 10 ALU at
                           5 CTAs, 11 ALU with 4 tiles and no pipeline at 3 CTAs; the query's
                           fragments in registers instead of shared memory: 12 ALU (2 tiles,
                           pipelined, 3 CTAs), 13 ALU with 4 tiles and no pipeline (3 CTAs);
                           14 as 8, but a step whose document ends in its first two tiles
                           computes only those; 15 14 with the document prefetched into L2 at
                           its start, 16 15 with the centroid term added after the MMAs (3
                           CTAs), 17 14 with that (3 CTAs), 18 17 at 4 CTAs (the default, 0),
                           19 17 with steps of 1-4 tiles at a document's end */
    int residual_path;  /* residual scoring (one query and batched): 1 the MMA kernel, an error
                           (KERN_EINVAL) where it has none for the shape (tests: that a dim
                           takes it); 2 the exact fp32 kernel (benchmarks: old against new) */
    int residual_afpack; /* residual kernel, many queries, A in registers: 1 every query's A
                            fragments packed once before the kernel (the default), 2 each warp
                            builds them from q (the former kernel: tests, benchmarks) */
} kern_gpu_tuning;

extern kern_gpu_tuning kern_gpu_tune;

#ifdef __cplusplus
}
#endif

#endif
