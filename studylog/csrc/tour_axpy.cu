// y = a * x + y, twice: the second version promises the compiler that x and y never alias
// (__restrict__) and reads x through the read-only data cache (__ldg). Notebook 00 compiles
// both to PTX on the CPU and looks for the difference: ld.global.nc instead of ld.global.

extern "C" __global__ void axpy_plain(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void axpy_restrict_ldg(const float* __restrict__ x, float* __restrict__ y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * __ldg(x + i) + y[i];
}
