// Where a GPU table's memory comes from. Inside TensorFlow an implementation
// wraps TF's allocators; the pybind11 module and tests use CudaAllocator()
// (cudaMalloc / cudaHostAlloc). Failure, out-of-memory included, is a Status,
// never an abort. No CUDA header is needed to implement it.

#ifndef DYNEMB_CORE_GPU_ALLOCATOR_H_
#define DYNEMB_CORE_GPU_ALLOCATOR_H_

#include <cstddef>

#include "cc/core/table.h"

namespace dynemb {

class GpuAllocator {
 public:
  virtual ~GpuAllocator() = default;
  // Device memory of `bytes` (> 0), aligned to at least 256 bytes.
  virtual Status AllocateDevice(size_t bytes, void** ptr) = 0;
  // Memory freed here may still be read by work already queued on a stream:
  // the implementation must not hand it out again before that work is done
  // (cudaFree waits for the device; TF's allocators are stream-ordered).
  virtual void FreeDevice(void* ptr) = 0;
  // Page-locked host memory mapped into the device's address space
  // (cudaHostAlloc with cudaHostAllocMapped): value rows beyond
  // max_hbm_for_values. Kernels read and write it over the bus.
  virtual Status AllocateMappedHost(size_t bytes, void** ptr) = 0;
  virtual void FreeMappedHost(void* ptr) = 0;
};

// The process-wide allocator over the CUDA runtime on the current device.
GpuAllocator* CudaAllocator();

}  // namespace dynemb

#endif  // DYNEMB_CORE_GPU_ALLOCATOR_H_
