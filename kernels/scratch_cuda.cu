/*
 * scratch_cuda.cu: the kernels' temporary device memory, stream-ordered on the default stream
 * from a memory pool of the kernels' own, with a count of the bytes held for scratch_cuda.h;
 * and the persistent grids' sizes, cached.
 *
 * Why a pool of our own: the device's default pool gives memory back at every synchronisation
 * (release threshold 0), so each call would pay for a fresh allocation (tens of microseconds,
 * measured: a 2 MB table cost about 45 us per call). Our pool keeps up to 256 MB between calls;
 * the application's default pool is left as it is. Where pools are not supported, plain
 * cudaMallocAsync is used.
 * The count is process-wide and atomic: a search spread over several GPUs (engine/search_gpus.c)
 * runs one thread per device at once; calls on one device come from one thread at a time.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>
#include <mutex>

#include "cuda_check.cuh"
#include "scratch_cuda.h"

#define MAX_DEVICES 64

static std::atomic<size_t> held, peak;
static cudaMemPool_t pools[MAX_DEVICES];
static unsigned char pool_state[MAX_DEVICES]; /* 0 untried, 1 ready, 2 unsupported */

static cudaMemPool_t pool_for_device(void)
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= MAX_DEVICES) {
        cudaGetLastError();
        return NULL;
    }
    if (pool_state[dev] == 0) {
        cudaMemPoolProps props = {};
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = dev;
        uint64_t keep = (uint64_t)256 << 20;
        if (cudaMemPoolCreate(&pools[dev], &props) == cudaSuccess &&
            cudaMemPoolSetAttribute(pools[dev], cudaMemPoolAttrReleaseThreshold, &keep) ==
                cudaSuccess) {
            pool_state[dev] = 1;
        } else {
            cudaGetLastError();
            pool_state[dev] = 2;
        }
    }
    return pool_state[dev] == 1 ? pools[dev] : NULL;
}

int kern_scratch(void **p, size_t bytes)
{
    cudaMemPool_t pool = pool_for_device();
    cudaError_t e = pool ? cudaMallocFromPoolAsync(p, bytes ? bytes : 1, pool, 0)
                         : cudaMallocAsync(p, bytes ? bytes : 1, 0);
    if (e != cudaSuccess) {
        *p = NULL;
        return kern_cuda_fail(e, "cudaMallocAsync (scratch)", __FILE__, __LINE__);
    }
    const size_t now = held.fetch_add(bytes) + bytes;
    size_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now))
        ;
    return KERN_OK;
}

void kern_scratch_free(void *p, size_t bytes)
{
    if (!p)
        return;
    cudaFreeAsync(p, 0);
    held -= bytes;
}

extern "C" size_t kern_gpu_scratch_peak(void)
{
    return peak;
}

extern "C" void kern_gpu_scratch_reset_peak(void)
{
    peak.store(held.load());
}

/* ---- persistent grid sizes ------------------------------------------------------------------ */

namespace
{
struct grid_entry {
    int dev, threads;
    const void *fn;
    size_t smem;
    long long ctas;
};
constexpr int GRID_CACHE = 256;
grid_entry grid_cache[GRID_CACHE];
int grid_cached;
std::mutex grid_lock;
} // namespace

static std::atomic<int> cc_cache[MAX_DEVICES]; /* 10 * major + minor, 0 until asked */

int kern_device_cc(void)
{
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) {
        cudaGetLastError();
        return -1;
    }
    const int known = dev < MAX_DEVICES ? cc_cache[dev].load(std::memory_order_relaxed) : 0;
    if (known > 0)
        return known;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    if (dev < MAX_DEVICES) /* the same value from any thread */
        cc_cache[dev].store(10 * major + minor, std::memory_order_relaxed);
    return 10 * major + minor;
}

int kern_resident_ctas(const void *fn, int threads, size_t smem, long long *ctas)
{
    int dev = 0;
    KERN_CUDA_TRY(cudaGetDevice(&dev));
    {
        std::lock_guard<std::mutex> hold(grid_lock);
        for (int i = 0; i < grid_cached; i++) {
            const grid_entry &e = grid_cache[i];
            if (e.fn == fn && e.dev == dev && e.threads == threads && e.smem == smem) {
                *ctas = e.ctas;
                return KERN_OK;
            }
        }
    }
    int sms = 0, per_sm = 0;
    if (smem > 0) /* static shared memory counts against the default 48 KB too */
        KERN_CUDA_TRY(
            cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    KERN_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    KERN_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, threads, smem));
    const long long n = (long long)(sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
    std::lock_guard<std::mutex> hold(grid_lock);
    if (grid_cached < GRID_CACHE)
        grid_cache[grid_cached++] = grid_entry{dev, threads, fn, smem, n};
    *ctas = n;
    return KERN_OK;
}
