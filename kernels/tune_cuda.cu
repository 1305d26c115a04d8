/* tune_cuda.cu: the launch overrides of tune_cuda.h, all automatic (0) by default. */
#include "tune_cuda.h"

extern "C" {
kern_gpu_tuning kern_gpu_tune = {0};
}
