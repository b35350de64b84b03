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

}  // namespace syncopate
