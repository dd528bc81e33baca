/* test_cuda_cast.c — cast codecs on the device (being written): skips without a device. */
#include <cuda_runtime.h>

int main(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return 77;
    return 0;
}
