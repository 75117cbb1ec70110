// CudaAllocator(): GpuAllocator over the CUDA runtime, and CudaStatus.

#include <cuda_runtime_api.h>

#include <string>

#include "cc/core/gpu/allocator.h"
#include "cc/core/gpu/gpu_table.h"

namespace dynemb {

Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::Ok();
  const StatusCode code = error == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted
                                                             : StatusCode::kInternal;
  return Status(code, std::string(what) + ": " + cudaGetErrorName(error) + " (" +
                          cudaGetErrorString(error) + ")");
}

namespace {

class CudaRuntimeAllocator : public GpuAllocator {
 public:
  Status AllocateDevice(size_t bytes, void** ptr) override {
    *ptr = nullptr;
    Status status = CudaStatus(cudaMalloc(ptr, bytes), "cudaMalloc");
    if (!status.ok()) {
      (void)cudaGetLastError();  // out-of-memory is not sticky: clear it
      return Status(status.code(), status.message() + " (" + std::to_string(bytes) + " bytes)");
    }
    return status;
  }
  void FreeDevice(void* ptr) override {
    if (ptr != nullptr) (void)cudaFree(ptr);  // waits for queued work (see allocator.h)
  }
  Status AllocateMappedHost(size_t bytes, void** ptr) override {
    *ptr = nullptr;
    Status status =
        CudaStatus(cudaHostAlloc(ptr, bytes, cudaHostAllocMapped | cudaHostAllocPortable),
                   "cudaHostAlloc");
    if (!status.ok()) {
      (void)cudaGetLastError();
      return Status(status.code(), status.message() + " (" + std::to_string(bytes) + " bytes)");
    }
    return status;
  }
  void FreeMappedHost(void* ptr) override {
    if (ptr != nullptr) (void)cudaFreeHost(ptr);
  }
};

}  // namespace

GpuAllocator* CudaAllocator() {
  static CudaRuntimeAllocator* allocator = new CudaRuntimeAllocator();
  return allocator;
}

}  // namespace dynemb
