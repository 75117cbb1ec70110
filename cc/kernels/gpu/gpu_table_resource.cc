// GpuTableResource and the pieces it is made of: TF's allocator as a
// GpuAllocator, TF's stream and allocate_temp as a GpuRunner.
// Host code only (compiled by the C++ compiler): the device code is the
// core's, compiled by nvcc (cc/core/gpu/*.cu).

#include "cc/kernels/gpu/gpu_table_resource.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cc/core/gpu/allocator.h"
#include "cc/core/gpu/gpu_table.h"
#include "cc/core/gpu/staged_table.h"
#include "cc/core/table_io.h"
#include "tensorflow/core/framework/allocator.h"
#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/framework/tensor.h"
#include "xla/stream_executor/stream.h"

namespace dynemb {
namespace {

using ::tensorflow::OpKernelContext;

// GpuAllocator over TF: device memory from the device's TF allocator, mapped
// host memory from cudaHostAlloc (see gpu_table_resource.h).
class TfGpuAllocator final : public GpuAllocator {
 public:
  explicit TfGpuAllocator(tensorflow::Allocator* device) : device_(device) {}

  Status AllocateDevice(size_t bytes, void** ptr) override {
    *ptr = device_->AllocateRaw(kAlignment, bytes);
    if (*ptr == nullptr) {
      return Status(StatusCode::kResourceExhausted,
                    "out of GPU memory: TF's allocator " + device_->Name() + " could not give " +
                        std::to_string(bytes) + " bytes to a tensorflow_dynemb table");
    }
    // GpuAllocator promises 256-byte alignment (TF's GPU allocators align
    // to 256 bytes); a block that is not is refused rather than misused.
    if (reinterpret_cast<uintptr_t>(*ptr) % kAlignment != 0) {
      device_->DeallocateRaw(*ptr);
      *ptr = nullptr;
      return Status(StatusCode::kInternal,
                    "TF's allocator " + device_->Name() + " returned memory not aligned to " +
                        std::to_string(kAlignment) + " bytes");
    }
    return Status::Ok();
  }

  // TF's GPU allocators reuse memory in the order of the compute stream, and
  // every operation of the table runs on that stream (gpu_table_resource.h).
  void FreeDevice(void* ptr) override {
    if (ptr != nullptr) device_->DeallocateRaw(ptr);
  }

  Status AllocateMappedHost(size_t bytes, void** ptr) override {
    return CudaAllocator()->AllocateMappedHost(bytes, ptr);
  }
  void FreeMappedHost(void* ptr) override { CudaAllocator()->FreeMappedHost(ptr); }

 private:
  static constexpr size_t kAlignment = 256;
  tensorflow::Allocator* const device_;
};

// One op's scratch: ctx->allocate_temp blocks, held until the op returns.
class TfScratch final : public GpuScratch {
 public:
  explicit TfScratch(OpKernelContext* ctx) : ctx_(ctx) {}

  Status Allocate(size_t bytes, void** ptr) override {
    tensorflow::Tensor block;
    DYNEMB_RETURN_IF_ERROR(FromTfStatus(ctx_->allocate_temp(
        tensorflow::DT_INT8, tensorflow::TensorShape({static_cast<int64_t>(bytes)}), &block)));
    *ptr = block.data();
    blocks_.push_back(std::move(block));
    return Status::Ok();
  }

 private:
  OpKernelContext* const ctx_;
  std::vector<tensorflow::Tensor> blocks_;
};

// The Runner of one op on a GPU table: TF's stream, TF's scratch.
class TfGpuRunner final : public GpuRunner {
 public:
  TfGpuRunner(cudaStream_t stream, OpKernelContext* ctx)
      : GpuRunner(stream, &scratch_), scratch_(ctx) {}

 private:
  TfScratch scratch_;
};

}  // namespace

// The op's CUDA stream: the compute stream of the op's device.
// (se::Stream::platform_specific_handle() is the CUstream in every TF from
// 2.16 to 2.21; a non-virtual exported function in 2.16, virtual since.)
absl::Status TfStream(OpKernelContext* ctx, cudaStream_t* stream) {
  tensorflow::DeviceContext* device_context = ctx->op_device_context();
  stream_executor::Stream* se_stream =
      device_context != nullptr ? device_context->stream() : nullptr;
  void* handle = se_stream != nullptr ? se_stream->platform_specific_handle().stream : nullptr;
  if (handle == nullptr) {
    return absl::InternalError(absl::StrCat("op ", ctx->op_kernel().name(), " on device ",
                                            ctx->device()->name(),
                                            " has no CUDA stream for its GPU table"));
  }
  *stream = static_cast<cudaStream_t>(handle);
  return absl::OkStatus();
}

namespace {

class GpuTableResource final : public TableResource {
 public:
  GpuTableResource(std::unique_ptr<TfGpuAllocator> allocator, std::unique_ptr<Table> table,
                   tensorflow::DataType key_dtype, tensorflow::DataType value_dtype,
                   tensorflow::TensorShape value_shape)
      : TableResource(table.get(), key_dtype, value_dtype, std::move(value_shape)),
        allocator_(std::move(allocator)),
        table_(std::move(table)) {}

  absl::Status NewRunner(OpKernelContext* ctx, std::unique_ptr<Runner>* runner) override {
    cudaStream_t stream = nullptr;
    TF_RETURN_IF_ERROR(TfStream(ctx, &stream));
    *runner = std::make_unique<TfGpuRunner>(stream, ctx);
    return absl::OkStatus();
  }

  // LoadTable reads host chunks: a staged view copies each to the device
  // (buffers from TF's allocator) and inserts it on the op's stream.
  Status LoadFiles(const std::vector<ByteSource*>& sources, const LoadOptions& options,
                   const Runner& runner) override {
    Status status;
    std::unique_ptr<StagedGpuTable> view =
        NewStagedGpuView(table(), runner, allocator_.get(), &status);
    if (view == nullptr) return status;
    return LoadTable(sources, *view, options, runner);
  }

 private:
  // Declared before the table, so the table (which frees into it) goes first.
  std::unique_ptr<TfGpuAllocator> allocator_;
  std::unique_ptr<Table> table_;
};

}  // namespace

absl::Status NewGpuTableResource(OpKernelContext* ctx, const TableOptions& options,
                                 tensorflow::DataType key_dtype, tensorflow::DataType value_dtype,
                                 const tensorflow::TensorShape& value_shape, TableResource** out) {
  cudaStream_t stream = nullptr;
  TF_RETURN_IF_ERROR(TfStream(ctx, &stream));
  // The device's own allocator, not the op's (ctx->get_allocator tracks one
  // step's allocations): the table outlives the op.
  auto allocator = std::make_unique<TfGpuAllocator>(
      ctx->device()->GetAllocator(tensorflow::AllocatorAttributes()));
  Status status;
  std::unique_ptr<Table> table = NewGpuTable(options, allocator.get(), &status, stream);
  if (table == nullptr) return ToTfStatus(status);
  *out = new GpuTableResource(std::move(allocator), std::move(table), key_dtype, value_dtype,
                              value_shape);
  return absl::OkStatus();
}

}  // namespace dynemb
