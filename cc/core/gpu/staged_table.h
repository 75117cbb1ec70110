// A Table over HOST memory backed by a GPU table (gpu_table.h): each call
// copies its inputs to the device, runs the GPU table, and copies the results
// back. It is what the pybind11 module tensorflow_dynemb._core_gpu wraps, so
// the conformance tests that drive the CPU table through NumPy arrays drive
// the GPU table unchanged. Callers that hold device memory (benchmarks) reach
// the GPU table itself through gpu_table() and gpu_runner().
//
// No CUDA header is needed to use it.

#ifndef DYNEMB_CORE_GPU_STAGED_TABLE_H_
#define DYNEMB_CORE_GPU_STAGED_TABLE_H_

#include <memory>
#include <string>

#include "cc/core/gpu/allocator.h"
#include "cc/core/table.h"

namespace dynemb {

class StagedGpuTable : public Table {
 public:
  // The GPU table (device pointers) and a GpuRunner on this table's stream.
  virtual Table& gpu_table() = 0;
  virtual const Runner& gpu_runner() const = 0;
  // Waits until everything queued on gpu_runner()'s stream has finished.
  virtual Status Synchronize() = 0;
  // GpuTableOps::Assign (gpu_table.h) on host batches: keys [n], values
  // [n, dim], scores [n] (nullable).
  virtual Status Assign(const void* keys, int64_t n, const void* values,
                        const uint64_t* scores) = 0;
};

// A staged GPU table on the current CUDA device, with cudaMalloc'ed memory.
// Returns nullptr and sets *status when the options are invalid or CUDA fails
// (no device, out of memory, ...).
std::unique_ptr<StagedGpuTable> NewStagedGpuTable(const TableOptions& options, Status* status);

// A staged view of an existing GPU table (NewGpuTable): host batches in and
// out, staged through device buffers from `allocator`, run on `gpu_runner`
// (a GpuRunner, copied with its scratch). `gpu_table` and `allocator` are not
// owned and must outlive the view. Inside TF this is how a table file
// (LoadTable reads host chunks) gets into a GPU table.
std::unique_ptr<StagedGpuTable> NewStagedGpuView(Table& gpu_table, const Runner& gpu_runner,
                                                 GpuAllocator* allocator, Status* status);

// Whether a CUDA device can be used by this build; if not, *reason says why.
bool GpuAvailable(std::string* reason);

}  // namespace dynemb

#endif  // DYNEMB_CORE_GPU_STAGED_TABLE_H_
