// The resource of a GPU table (CUDA builds only): a core GPU table
// (cc/core/gpu/gpu_table.h) whose memory is TensorFlow's and whose work runs
// on TensorFlow's stream.
//
//   * Device memory (slots, keys, scores, value rows) comes from the op
//     device's TF allocator, so it counts against TF's GPU memory and an
//     out-of-memory is a RESOURCE_EXHAUSTED error, never an abort.
//   * Value rows beyond max_hbm_for_values are pinned host memory mapped into
//     the device's address space, from cudaHostAlloc (CudaAllocator()): TF's
//     GPU host allocator is a pool for staging copies and does not promise
//     memory the device can address, which these rows need.
//   * Every op runs on the device's compute stream: batch ops through the
//     Runner NewRunner gives (with scratch from ctx->allocate_temp), and the
//     table's runner-less operations (Clear, Export, set-up) because the
//     table is created on that stream. TF's allocator orders its memory on
//     that stream, so memory TF hands out is never still in use there.

#ifndef DYNEMB_KERNELS_GPU_GPU_TABLE_RESOURCE_H_
#define DYNEMB_KERNELS_GPU_GPU_TABLE_RESOURCE_H_

#include <cuda_runtime_api.h>

#include "cc/core/table.h"
#include "cc/kernels/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace dynemb {

// A new GPU table resource on ctx's device, holding an empty table of
// `options` (int32 or int64 keys). Errors: CUDA failures (no usable device, a
// driver older than the CUDA runtime this library was built with), out of
// memory, invalid options.
absl::Status NewGpuTableResource(tensorflow::OpKernelContext* ctx, const TableOptions& options,
                                 tensorflow::DataType key_dtype, tensorflow::DataType value_dtype,
                                 const tensorflow::TensorShape& value_shape, TableResource** out);

// The op's CUDA stream: the compute stream of ctx's device, on which every
// GPU kernel of this library queues its work. Errors: an op device without a
// stream.
absl::Status TfStream(tensorflow::OpKernelContext* ctx, cudaStream_t* stream);

}  // namespace dynemb

#endif  // DYNEMB_KERNELS_GPU_GPU_TABLE_RESOURCE_H_
