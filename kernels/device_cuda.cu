/*
 * device_cuda.cu: the CUDA device, its memory and copies. Every CUDA call's status is checked;
 * failures become KERN_EDEVICE with the CUDA error text in kern_last_error(), never an exit.
 * The runtime is linked statically, so a build with CUDA loads and runs on a machine with no
 * GPU or driver: cudaGetDeviceCount then fails and the count is 0.
 */
#include <cuda_runtime.h>

#include "kernels_impl.h"

extern "C" int kern_gpu_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no driver" status */
        return 0;
    }
    return n;
}

extern "C" int kern_gpu_set_device(int dev)
{
    cudaError_t e = cudaSetDevice(dev);
    if (e != cudaSuccess) {
        cudaGetLastError();
        kern_set_error("cudaSetDevice(%d): %s", dev, cudaGetErrorString(e));
        return KERN_EDEVICE;
    }
    return KERN_OK;
}

extern "C" int kern_gpu_get_device(int *dev)
{
    cudaError_t e = cudaGetDevice(dev);
    if (e != cudaSuccess) {
        cudaGetLastError();
        kern_set_error("cudaGetDevice: %s", cudaGetErrorString(e));
        return KERN_EDEVICE;
    }
    return KERN_OK;
}

extern "C" int kern_gpu_malloc(void **p, size_t bytes)
{
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* a failed allocation must not be reported by the next launch */
        kern_set_error("cudaMalloc(%zu): %s", bytes, cudaGetErrorString(e));
        *p = NULL;
        return e == cudaErrorMemoryAllocation ? KERN_ENOMEM : KERN_EDEVICE;
    }
    return KERN_OK;
}

extern "C" void kern_gpu_free(void *p)
{
    if (p)
        cudaFree(p);
}

extern "C" int kern_gpu_copy(void *dst, const void *src, size_t bytes, int to_device)
{
    cudaError_t e =
        cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        cudaGetLastError();
        kern_set_error("cudaMemcpy(%zu bytes): %s", bytes, cudaGetErrorString(e));
        return KERN_EDEVICE;
    }
    return KERN_OK;
}

extern "C" int kern_gpu_sync(void)
{
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        kern_set_error("cudaDeviceSynchronize: %s", cudaGetErrorString(e));
        return KERN_EDEVICE;
    }
    return KERN_OK;
}
