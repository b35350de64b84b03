// What a CUDA device can do, asked of the driver (the CUDA runtime when built with it).
#pragma once

namespace syncopate {

// Compute capability of CUDA device `device` as major * 10 + minor (H100: 90, A100: 80, V100: 70);
// -1 when this build has no CUDA or the device cannot be queried.
int cuda_compute_capability(int device);

// Free and total memory of CUDA device `device`, bytes, as the driver reports them now (what the
// caching allocator holds counts as used); false when this build has no CUDA or the query failed.
bool cuda_memory(int device, long long& free_bytes, long long& total_bytes);

}  // namespace syncopate
