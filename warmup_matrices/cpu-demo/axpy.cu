// A tiny CUDA kernel compiled to an sm_90a cubin by the CPU demo (no GPU needed).
extern "C" __global__ void axpy(float a, const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i] + y[i];
    }
}
