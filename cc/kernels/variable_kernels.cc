// CPU kernels of cc/ops/variable_ops.cc.

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "cc/core/partition.h"
#include "cc/core/table.h"
#include "cc/kernels/keyed_random_attrs.h"
#include "cc/kernels/table_resource.h"
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
    int32_t num_shards = 0;
    OP_REQUIRES_OK(ctx, ReadNumShards(ctx->input(1), &num_shards));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &out));
    int32_t* shards = out->flat<int32_t>().data();
    ForEachKey<K>(ctx, keys, 20, [&](auto key, int64_t i) { shards[i] = ShardOfKey(key, num_shards); });
  }
};

template <typename K, typename T>
class KeyedRandomOp : public OpKernel {
 public:
  explicit KeyedRandomOp(OpKernelConstruction* ctx) : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    const int64_t dim = attrs_.dim();
    TensorShape shape = keys.shape();
    OP_REQUIRES_OK(ctx, shape.AddDimWithStatus(dim));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out));
    T* rows = out->flat<T>().data();
    ForEachKey<K>(ctx, keys, 40 * dim, [&](auto key, int64_t i) { attrs_.Draw(key, rows + i * dim); });
  }

 private:
  KeyedRandomAttrs attrs_;
};

// values with the rows of the keys that do not exist drawn as DynembKeyedRandom
// draws them; the rows of existing keys pass through (in place when TF lets
// the op reuse the values' buffer).
template <typename K, typename T>
class KeyedRandomFillOp : public OpKernel {
 public:
  explicit KeyedRandomFillOp(OpKernelConstruction* ctx) : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& values = ctx->input(0);
    const Tensor& exists = ctx->input(1);
    const Tensor& keys = ctx->input(2);
    const int64_t dim = attrs_.dim();
    TensorShape shape;
    OP_REQUIRES_OK(ctx, CheckFillShapes(values, exists, keys, dim, &shape));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, shape, &out));
    T* rows = out->flat<T>().data();
    if (rows != values.flat<T>().data()) {
      std::copy_n(values.flat<T>().data(), values.NumElements(), rows);
    }
    // A step that revisits known ids (most steps of a trained model) has nothing to
    // draw: it hands nothing to the thread pool (issue 35: 213 us per op before, in a
    // step of 26 per-feature tables). Counting first allocates nothing.
    const int64_t n = keys.NumElements();
    const bool* found = exists.flat<bool>().data();
    const int64_t missing = n - std::count(found, found + n, true);
    if (missing == 0) return;
    // The pool's cost estimate is per key, and only the missing ones cost a draw.
    const int64_t cost_per_key = std::max<int64_t>(1, 40 * dim * missing / n);
    ForEachKey<K>(ctx, keys, cost_per_key, [&](auto key, int64_t i) {
      if (!found[i]) attrs_.Draw(key, rows + i * dim);
    });
  }

 private:
  KeyedRandomAttrs attrs_;
};

DYNEMB_REGISTER_KEYED_OPS(tensorflow::DEVICE_CPU, int32_t, PartitionOp, KeyedRandomOp,
                          KeyedRandomFillOp)
DYNEMB_REGISTER_KEYED_OPS(tensorflow::DEVICE_CPU, int64_t, PartitionOp, KeyedRandomOp,
                          KeyedRandomFillOp)
DYNEMB_REGISTER_KEYED_OPS(tensorflow::DEVICE_CPU, tensorflow::tstring, PartitionOp, KeyedRandomOp,
                          KeyedRandomFillOp)

}  // namespace
}  // namespace dynemb
