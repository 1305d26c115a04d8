/*
 * device.c: which device a piece of work runs on (tartan_device, tartan_gpu_mode in tartan.h).
 * The environment is read at each call, so that a long-lived process can be steered between
 * runs without reopening its index.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "kernels.h"

int eng_device_pick(tartan_device want, kern_dev *out, store_msg *m)
{
    if ((unsigned)want > TARTAN_DEVICE_CUDA)
        return store_fail(m, TARTAN_EINVAL, "device is %d; it must be a tartan_device",
                          (int)want);
    if (want == TARTAN_DEVICE_AUTO) {
        const char *e = getenv("TARTAN_DEVICE");
        if (e && *e && strcmp(e, "auto") != 0) {
            if (strcmp(e, "cpu") == 0)
                want = TARTAN_DEVICE_CPU;
            else if (strcmp(e, "cuda") == 0)
                want = TARTAN_DEVICE_CUDA;
            else
                return store_fail(m, TARTAN_EINVAL,
                                  "TARTAN_DEVICE is '%.40s'; it must be auto, cpu or cuda", e);
        }
    }
    if (want == TARTAN_DEVICE_CPU) {
        *out = KERN_DEV_CPU;
        return 0;
    }
    int gpus = kern_cuda_device_count();
    if (want == TARTAN_DEVICE_CUDA && gpus <= 0)
        return store_fail(m, TARTAN_ENODEV,
#ifdef TARTAN_HAVE_CUDA
                          "the CUDA device was asked for, but no usable GPU is present"
#else
                          "the CUDA device was asked for, but this build has no CUDA"
#endif
        );
    *out = gpus > 0 ? KERN_DEV_CUDA : KERN_DEV_CPU;
    return 0;
}

int eng_gpu_mode_pick(tartan_gpu_mode want, tartan_gpu_mode *out, store_msg *m)
{
    if ((unsigned)want > TARTAN_GPU_STREAMING)
        return store_fail(m, TARTAN_EINVAL, "gpu_mode is %d; it must be a tartan_gpu_mode",
                          (int)want);
    if (want == TARTAN_GPU_AUTO) {
        const char *e = getenv("TARTAN_GPU_MODE");
        if (e && *e && strcmp(e, "auto") != 0) {
            if (strcmp(e, "resident") == 0)
                want = TARTAN_GPU_RESIDENT;
            else if (strcmp(e, "streaming") == 0)
                want = TARTAN_GPU_STREAMING;
            else
                return store_fail(m, TARTAN_EINVAL,
                                  "TARTAN_GPU_MODE is '%.40s'; it must be auto, resident or "
                                  "streaming",
                                  e);
        }
    }
    *out = want;
    return 0;
}

int tartan_device_resolve(tartan_device want, tartan_device *where)
{
    if (!where)
        return TARTAN_EINVAL;
    store_msg m = {{0}};
    kern_dev dev = KERN_DEV_CPU;
    int rc = eng_device_pick(want, &dev, &m);
    if (rc)
        return rc;
    *where = dev == KERN_DEV_CUDA ? TARTAN_DEVICE_CUDA : TARTAN_DEVICE_CPU;
    return 0;
}
