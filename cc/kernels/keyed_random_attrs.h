// The attrs of the keyed-random ops (DynembKeyedRandom, DynembKeyedRandomFill;
// cc/ops/variable_ops.cc) and the input checks of those ops and of
// DynembPartition, shared by their CPU kernels (variable_kernels.cc) and GPU
// kernels (gpu/variable_kernels_gpu.cc), so both refuse the same inputs with
// the same errors. A key's row depends only on the attrs and the key.

#ifndef DYNEMB_KERNELS_KEYED_RANDOM_ATTRS_H_
#define DYNEMB_KERNELS_KEYED_RANDOM_ATTRS_H_

#include <cstdint>
#include <string>

#include "cc/core/partition.h"
#include "cc/core/table.h"
#include "cc/kernels/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace dynemb {

class KeyedRandomAttrs {
 public:
  explicit KeyedRandomAttrs(tensorflow::OpKernelConstruction* ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ToTfStatus(CheckDim(dim_)));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &seed_));
    std::string distribution;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("distribution", &distribution));
    dist_ = distribution == "uniform"  ? KeyedDistribution::kUniform
            : distribution == "normal" ? KeyedDistribution::kNormal
                                       : KeyedDistribution::kTruncatedNormal;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("a", &a_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("b", &b_));
  }

  int64_t dim() const { return dim_; }
  uint64_t seed() const { return static_cast<uint64_t>(seed_); }
  KeyedDistribution dist() const { return dist_; }
  // The float attrs, widened as the draws use them.
  double a() const { return a_; }
  double b() const { return b_; }

  // Draws `key`'s row into row[0 .. dim) (host memory).
  template <typename T, typename Key>
  void Draw(Key key, T* row) const {
    KeyedRandomRow(seed(), StableKeyHash(key), dim_, dist_, a(), b(), row);
  }

 private:
  int64_t dim_ = 0;
  int64_t seed_ = 0;
  KeyedDistribution dist_ = KeyedDistribution::kNormal;
  float a_ = 0;
  float b_ = 0;
};

// DynembPartition's num_shards input (host memory): a scalar >= 1.
inline absl::Status ReadNumShards(const tensorflow::Tensor& num_shards_t, int32_t* num_shards) {
  if (!tensorflow::TensorShapeUtils::IsScalar(num_shards_t.shape())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_shards must be a scalar, got shape ", num_shards_t.shape().DebugString()));
  }
  *num_shards = num_shards_t.scalar<int32_t>()();
  if (*num_shards < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_shards must be >= 1, got ", *num_shards));
  }
  return absl::OkStatus();
}

// DynembKeyedRandomFill's inputs: values of keys.shape + [dim] (*shape) and
// exists of keys.shape.
inline absl::Status CheckFillShapes(const tensorflow::Tensor& values,
                                    const tensorflow::Tensor& exists,
                                    const tensorflow::Tensor& keys, int64_t dim,
                                    tensorflow::TensorShape* shape) {
  *shape = keys.shape();
  TF_RETURN_IF_ERROR(shape->AddDimWithStatus(dim));
  if (values.shape() != *shape) {
    return absl::InvalidArgumentError(absl::StrCat("Expected shape ", shape->DebugString(),
                                                   " for values, got ",
                                                   values.shape().DebugString()));
  }
  if (exists.shape() != keys.shape()) {
    return absl::InvalidArgumentError(absl::StrCat("Expected shape ", keys.shape().DebugString(),
                                                   " for exists, got ",
                                                   exists.shape().DebugString()));
  }
  return absl::OkStatus();
}

}  // namespace dynemb

// Registers the three ops' kernels for one device and key type K: Partition<K>,
// Random<K, float | double>, Fill<K, float | double> (the CPU's and the GPU's
// kernel templates), so both devices register the same type combinations.
#define DYNEMB_REGISTER_KEYED_OPS(device, K, Partition, Random, Fill)                   \
  REGISTER_KERNEL_BUILDER(                                                             \
      Name("DynembPartition").Device(device).TypeConstraint<K>("Tkey").HostMemory(      \
          "num_shards"),                                                               \
      Partition<K>);                                                                   \
  DYNEMB_REGISTER_KEYED_ROWS(device, K, "DynembKeyedRandom", Random, float)            \
  DYNEMB_REGISTER_KEYED_ROWS(device, K, "DynembKeyedRandom", Random, double)           \
  DYNEMB_REGISTER_KEYED_ROWS(device, K, "DynembKeyedRandomFill", Fill, float)          \
  DYNEMB_REGISTER_KEYED_ROWS(device, K, "DynembKeyedRandomFill", Fill, double)
#define DYNEMB_REGISTER_KEYED_ROWS(device, K, op, Kernel, T)                             \
  REGISTER_KERNEL_BUILDER(                                                             \
      Name(op).Device(device).TypeConstraint<K>("Tkey").TypeConstraint<T>("dtype"),     \
      (Kernel<K, T>));

#endif  // DYNEMB_KERNELS_KEYED_RANDOM_ATTRS_H_
