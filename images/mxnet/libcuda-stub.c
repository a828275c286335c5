/* A stand-in libcuda.so.1 for hosts without NVIDIA's driver.
 *
 * libmxnet.so of mxnet-cu112 names libcuda.so.1 as a needed library and binds
 * these ten driver functions, so without a driver `import mxnet` fails.  With
 * a GPU the host's driver is mounted into the container and this file is not
 * on the library path; the image keeps it in /opt/dlbench/cuda-stub, which a
 * check without a GPU puts on LD_LIBRARY_PATH.  Every call reports
 * CUDA_ERROR_NO_DEVICE (100); the runtime library then finds no GPU and
 * mx.context.num_gpus() returns 0. */
typedef int CUresult;
enum { NO_DEVICE = 100 };

CUresult cuInit(unsigned int flags) { (void)flags; return NO_DEVICE; }
CUresult cuDriverGetVersion(int *version) { *version = 0; return NO_DEVICE; }
CUresult cuGetErrorString(CUresult error, const char **text)
{
    (void)error;
    *text = "no CUDA driver (dlbench stand-in libcuda.so.1)";
    return 0;
}

#define NO_DRIVER(name) CUresult name(void) { return NO_DEVICE; }
NO_DRIVER(cuDeviceGet)
NO_DRIVER(cuDevicePrimaryCtxRetain)
NO_DRIVER(cuGraphKernelNodeGetParams)
NO_DRIVER(cuGraphNodeGetType)
NO_DRIVER(cuLaunchKernel)
NO_DRIVER(cuModuleGetFunction)
NO_DRIVER(cuModuleLoadData)
NO_DRIVER(cuModuleLoadDataEx)
NO_DRIVER(cuModuleUnload)
