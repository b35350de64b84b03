#include "common/comm/cuda_device.h"

#ifdef SYNCOPATE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace syncopate {

int cuda_compute_capability(int device) {
#ifdef SYNCOPATE_CUDA
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
    return -1;
  return major * 10 + minor;
#else
  (void)device;
  return -1;
#endif
}

bool cuda_memory(int device, long long& free_bytes, long long& total_bytes) {
#ifdef SYNCOPATE_CUDA
  int before = 0;
  if (cudaGetDevice(&before) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) return false;
  size_t f = 0, t = 0;
  const bool ok = cudaMemGetInfo(&f, &t) == cudaSuccess;
  cudaSetDevice(before);
  free_bytes = static_cast<long long>(f);
  total_bytes = static_cast<long long>(t);
  return ok;
#else
  (void)device;
  free_bytes = total_bytes = 0;
  return false;
#endif
}

}  // namespace syncopate
