/*
 * order_key_cuda.cuh: floats as unsigned keys in the same order, for atomicMax and radix
 * selects over scores (the probe's column bests, written by the score-table kernel and read
 * by the probe; the stopping rule's k-th best). NaN is the callers' to leave out.
 */
#ifndef TARTAN_ORDER_KEY_CUDA_CUH
#define TARTAN_ORDER_KEY_CUDA_CUH

/* Negative floats with every bit flipped, the others with the top bit set: unsigned order is
 * float order, and 0 is below every float's key. */
__device__ __forceinline__ unsigned order_key(float x)
{
    const unsigned u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The float of a key (order_key's inverse). */
__device__ __forceinline__ float key_value(unsigned k)
{
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

#endif
