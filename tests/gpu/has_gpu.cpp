// has_gpu.cpp: exits 0 when the CUDA runtime sees a device, 1 otherwise (prints which), so that ctest can skip the
// GPU tests on a machine with the toolkit but without a GPU (tests/CMakeLists.txt, label gpu).
#include <cuda_runtime.h>

#include <cstdio>

int main() {
    int count = 0;
    const cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess || count == 0) {
        std::printf("no CUDA device: %s\n", rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
        return 1;
    }
    std::printf("%d CUDA device(s)\n", count);
    return 0;
}
