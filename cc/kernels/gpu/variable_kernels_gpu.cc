// GPU kernels of DynembPartition, DynembKeyedRandom and DynembKeyedRandomFill
// (cc/ops/variable_ops.cc; CUDA builds only): the ids stay on the device. They
// take int32 and int64 keys (string keys have no GPU kernel, so TF places
// those ops on the CPU) and queue the core's kernels (cc/core/gpu/keyed_gpu.h)
// on the op's CUDA stream; only DynembPartition's num_shards is in host
// memory. Their inputs are checked as the CPU kernels check them
// (keyed_random_attrs.h), and they compute the CPU kernels' results: shard
// ids and uniform rows bit for bit, normal and truncated-normal rows to an
// ulp or so (keyed_gpu.h; docs/gpu.md).
// Host code only (compiled by the C++ compiler with -DGOOGLE_CUDA=1).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cc/core/gpu/gpu_table.h"  // CudaStatus
#include "cc/core/gpu/keyed_gpu.h"
#include "cc/kernels/gpu/gpu_table_resource.h"  // TfStream
#include "cc/kernels/keyed_random_attrs.h"
#include "cc/kernels/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace dynemb {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

template <typename K>
class PartitionGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    int32_t num_shards = 0;
    OP_REQUIRES_OK(ctx, ReadNumShards(ctx->input(1), &num_shards));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &out));
    cudaStream_t stream = nullptr;
    OP_REQUIRES_OK(ctx, TfStream(ctx, &stream));
    OP_REQUIRES_OK(ctx, ToTfStatus(PartitionKeysGpu<K>(keys.flat<K>().data(), keys.NumElements(),
                                                       num_shards, out->flat<int32_t>().data(),
                                                       stream)));
  }
};

KeyedRandomSpec SpecOf(const KeyedRandomAttrs& attrs) {
  KeyedRandomSpec spec;
  spec.seed = attrs.seed();
  spec.dist = attrs.dist();
  spec.a = attrs.a();
  spec.b = attrs.b();
  spec.dim = attrs.dim();
  return spec;
}

template <typename K, typename T>
class KeyedRandomGpuOp : public OpKernel {
 public:
  explicit KeyedRandomGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    TensorShape shape = keys.shape();
    OP_REQUIRES_OK(ctx, shape.AddDimWithStatus(attrs_.dim()));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out));
    cudaStream_t stream = nullptr;
    OP_REQUIRES_OK(ctx, TfStream(ctx, &stream));
    OP_REQUIRES_OK(ctx, ToTfStatus(KeyedRandomRowsGpu<K, T>(keys.flat<K>().data(),
                                                            keys.NumElements(), SpecOf(attrs_),
                                                            nullptr, out->flat<T>().data(),
                                                            stream)));
  }

 private:
  KeyedRandomAttrs attrs_;
};

// values with the rows of the keys that do not exist drawn anew (in place
// when TF lets the op reuse the values' buffer, else after a device copy).
template <typename K, typename T>
class KeyedRandomFillGpuOp : public OpKernel {
 public:
  explicit KeyedRandomFillGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& values = ctx->input(0);
    const Tensor& exists = ctx->input(1);
    const Tensor& keys = ctx->input(2);
    TensorShape shape;
    OP_REQUIRES_OK(ctx, CheckFillShapes(values, exists, keys, attrs_.dim(), &shape));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, shape, &out));
    cudaStream_t stream = nullptr;
    OP_REQUIRES_OK(ctx, TfStream(ctx, &stream));
    T* rows = out->flat<T>().data();
    const T* source = values.flat<T>().data();
    if (rows != source && values.NumElements() > 0) {
      OP_REQUIRES_OK(ctx, ToTfStatus(CudaStatus(
                              cudaMemcpyAsync(rows, source, values.NumElements() * sizeof(T),
                                              cudaMemcpyDeviceToDevice, stream),
                              "DynembKeyedRandomFill: copying values")));
    }
    OP_REQUIRES_OK(ctx, ToTfStatus(KeyedRandomRowsGpu<K, T>(
                            keys.flat<K>().data(), keys.NumElements(), SpecOf(attrs_),
                            exists.flat<bool>().data(), rows, stream)));
  }

 private:
  KeyedRandomAttrs attrs_;
};

DYNEMB_REGISTER_KEYED_OPS(tensorflow::DEVICE_GPU, int32_t, PartitionGpuOp, KeyedRandomGpuOp,
                          KeyedRandomFillGpuOp)
DYNEMB_REGISTER_KEYED_OPS(tensorflow::DEVICE_GPU, int64_t, PartitionGpuOp, KeyedRandomGpuOp,
                          KeyedRandomFillGpuOp)

}  // namespace
}  // namespace dynemb
