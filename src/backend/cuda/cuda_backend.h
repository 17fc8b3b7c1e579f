// The CUDA backend (built with -DKEEL_CUDA=ON, docs/cuda.md): every op of backend.h on one NVIDIA
// GPU, in fp32 and bf16. Memory is device memory from cudaMalloc, owned by the backend; ops run in
// order on one stream; GEMMs go through cuBLASLt, the rest through the kernels of
// cuda_kernels.cu. Plain C++: callers need no CUDA headers.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/status.h"

namespace keel {

// OK when a CUDA device can be used; otherwise InvalidArgument naming
// what the driver said (no device, no driver) and what to do.
Status CudaDeviceAvailable();
// Throws KeelError when no device can be used (check CudaDeviceAvailable first).
std::unique_ptr<Backend> MakeCudaBackend();

}  // namespace keel
