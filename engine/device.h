/*
 * device.h: device selection (layer prefix eng_).
 */
#ifndef TARTAN_ENGINE_DEVICE_H
#define TARTAN_ENGINE_DEVICE_H

#include "kernels.h"
#include "store.h"
#include "tartan.h"

/*
 * The device for work asked to run on want (TARTAN_DEVICE_AUTO: the TARTAN_DEVICE
 * environment variable, else a GPU when one is usable, else the CPU). TARTAN_ENODEV when CUDA
 * is asked for and cannot be had; TARTAN_EINVAL for a bad value (argument or environment).
 */
int eng_device_pick(tartan_device want, kern_dev *out, store_msg *m);

/* The GPU mode asked for: want, or for TARTAN_GPU_AUTO the TARTAN_GPU_MODE environment
 * variable's (which may again be TARTAN_GPU_AUTO: decide by size). TARTAN_EINVAL for a bad
 * value. */
int eng_gpu_mode_pick(tartan_gpu_mode want, tartan_gpu_mode *out, store_msg *m);

#endif
