// CPU kernels of cc/ops/variable_ops.cc.

#include <cstdint>
#include <string_view>

#include "cc/core/partition.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/util/work_sharder.h"

namespace dynemb {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

// Key i of a keys tensor as the core's key type (string keys as views).
template <typename K>
struct KeyAt {
  const K* keys;
  K operator()(int64_t i) const { return keys[i]; }
};
template <>
struct KeyAt<tensorflow::tstring> {
  const tensorflow::tstring* keys;
  std::string_view operator()(int64_t i) const { return {keys[i].data(), keys[i].size()}; }
};

// Runs fn(key, i) for every key on the intra-op pool.
template <typename K, typename Fn>
void ForEachKey(OpKernelContext* ctx, const Tensor& keys, int64_t cost_per_key, Fn fn) {
  const KeyAt<K> at{keys.flat<K>().data()};
  auto* pool = ctx->device()->tensorflow_cpu_worker_threads();
  tensorflow::Shard(pool->num_threads, pool->workers, keys.NumElements(), cost_per_key,
                    [&](int64_t begin, int64_t end) {
                      for (int64_t i = begin; i < end; ++i) fn(at(i), i);
                    });
}

template <typename K>
class PartitionOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    const Tensor& num_shards_t = ctx->input(1);
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(num_shards_t.shape()),
                absl::InvalidArgumentError(absl::StrCat(
                    "num_shards must be a scalar, got shape ", num_shards_t.shape().DebugString())));
    const int32_t num_shards = num_shards_t.scalar<int32_t>()();
    OP_REQUIRES(ctx, num_shards >= 1,
                absl::InvalidArgumentError(
                    absl::StrCat("num_shards must be >= 1, got ", num_shards)));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &out));
    int32_t* shards = out->flat<int32_t>().data();
    ForEachKey<K>(ctx, keys, 20, [&](auto key, int64_t i) { shards[i] = ShardOfKey(key, num_shards); });
  }
};

template <typename K, typename T>
class KeyedRandomOp : public OpKernel {
 public:
  explicit KeyedRandomOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &dim_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &seed_));
    std::string distribution;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("distribution", &distribution));
    dist_ = distribution == "uniform"  ? KeyedDistribution::kUniform
            : distribution == "normal" ? KeyedDistribution::kNormal
                                       : KeyedDistribution::kTruncatedNormal;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("a", &a_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("b", &b_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    TensorShape shape = keys.shape();
    shape.AddDim(dim_);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out));
    T* rows = out->flat<T>().data();
    const uint64_t seed = static_cast<uint64_t>(seed_);
    ForEachKey<K>(ctx, keys, 40 * dim_, [&](auto key, int64_t i) {
      KeyedRandomRow(seed, StableKeyHash(key), dim_, dist_, a_, b_, rows + i * dim_);
    });
  }

 private:
  int64_t dim_;
  int64_t seed_;
  KeyedDistribution dist_;
  float a_;
  float b_;
};

#define DYNEMB_REGISTER_KEYED(K)                                                       \
  REGISTER_KERNEL_BUILDER(Name("DynembPartition")                                      \
                              .Device(tensorflow::DEVICE_CPU)                          \
                              .TypeConstraint<K>("Tkey")                               \
                              .HostMemory("num_shards"),                               \
                          PartitionOp<K>);                                             \
  REGISTER_KERNEL_BUILDER(Name("DynembKeyedRandom")                                    \
                              .Device(tensorflow::DEVICE_CPU)                          \
                              .TypeConstraint<K>("Tkey")                               \
                              .TypeConstraint<float>("dtype"),                         \
                          (KeyedRandomOp<K, float>));                                  \
  REGISTER_KERNEL_BUILDER(Name("DynembKeyedRandom")                                    \
                              .Device(tensorflow::DEVICE_CPU)                          \
                              .TypeConstraint<K>("Tkey")                               \
                              .TypeConstraint<double>("dtype"),                        \
                          (KeyedRandomOp<K, double>));

DYNEMB_REGISTER_KEYED(int32_t)
DYNEMB_REGISTER_KEYED(int64_t)
DYNEMB_REGISTER_KEYED(tensorflow::tstring)

#undef DYNEMB_REGISTER_KEYED

}  // namespace
}  // namespace dynemb
