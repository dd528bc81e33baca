/*
 * device.c — which device ops serve a pointer. The one place outside CMake and
 * codecs/common.h that knows whether the library was built with CUDA: everything else asks
 * gcomp__device_for() and calls the table it gets.
 */
#include "device.h"

#if defined(GCOMP_WITH_CUDA)
/* cuda/device.cu */
extern const gcomp__device_ops gcomp__device_cuda;
/* 1 when ptr is memory of a CUDA device (*device set), 0 for host memory or no usable CUDA */
int gcomp__cuda_locate(const void *ptr, int *device);
int gcomp__cuda_current_device(void);
int gcomp__cuda_set_device(int device); /* 0, or the runtime's error */
#endif

gcomp_result gcomp__device_use(int device)
{
#if defined(GCOMP_WITH_CUDA)
    if (device < 0 || device == gcomp__cuda_current_device()) return GCOMP_SUCCESS;
    if (gcomp__cuda_set_device(device) != 0)
        return gcomp__fail(GCOMP_ERR_TRANSPORT, "cuda: cannot make device %d current on this thread", device);
#else
    (void)device;
#endif
    return GCOMP_SUCCESS;
}

int gcomp__device_current(void)
{
#if defined(GCOMP_WITH_CUDA)
    return gcomp__cuda_current_device();
#else
    return -1;
#endif
}

gcomp_result gcomp__device_for(const void *ptr, const gcomp__device_ops **ops, int *device)
{
    int dev = -1;
    *ops = &gcomp__device_host;
    if (device) *device = -1;
#if defined(GCOMP_WITH_CUDA)
    if (ptr && gcomp__cuda_locate(ptr, &dev)) {
        int cur = gcomp__cuda_current_device();
        if (dev != cur)
            return gcomp__fail(GCOMP_ERR_INVALID_ARG,
                               "pointer %p is memory of CUDA device %d, but the current device is %d "
                               "(call cudaSetDevice(%d) first)",
                               ptr, dev, cur, dev);
        *ops = &gcomp__device_cuda;
    }
#else
    (void)ptr;
#endif
    if (device) *device = dev;
    return GCOMP_SUCCESS;
}
