// CPU kernels of cc/ops/step_ops.cc over cc/core/dedup.h.

#include <algorithm>
#include <cstdint>
#include <limits>

#include "cc/core/dedup.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/util/work_sharder.h"

namespace dynemb {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

template <typename K, typename Index>
class UniqueOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsVector(keys.shape()),
                absl::InvalidArgumentError(absl::StrCat(
                    "keys must be a vector, got shape ", keys.shape().DebugString())));
    const int64_t n = keys.NumElements();
    OP_REQUIRES(ctx, n < std::numeric_limits<int32_t>::max(),
                absl::InvalidArgumentError(absl::StrCat(
                    "keys must hold fewer than 2^31 - 1 keys, got ", n)));
    Tensor* index = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &index));
    Tensor unique;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(keys.dtype(), keys.shape(), &unique));
    const int64_t m =
        DedupKeys(keys.flat<K>().data(), n, unique.flat<K>().data(), index->flat<Index>().data());
    ctx->set_output(0, unique.Slice(0, m));
  }
};

template <typename T, typename Index>
class SegmentSumOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& values = ctx->input(0);
    const Tensor& segment_ids = ctx->input(1);
    const Tensor& num_segments_t = ctx->input(2);
    OP_REQUIRES(ctx, values.dims() >= 1,
                absl::InvalidArgumentError(absl::StrCat(
                    "values must have rank >= 1, got shape ", values.shape().DebugString())));
    OP_REQUIRES(ctx,
                tensorflow::TensorShapeUtils::IsVector(segment_ids.shape()) &&
                    segment_ids.dim_size(0) == values.dim_size(0),
                absl::InvalidArgumentError(absl::StrCat(
                    "segment_ids must be a vector of one id per row of values (",
                    values.dim_size(0), "), got shape ", segment_ids.shape().DebugString())));
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsScalar(num_segments_t.shape()),
                absl::InvalidArgumentError(absl::StrCat("num_segments must be a scalar, got shape ",
                                                        num_segments_t.shape().DebugString())));
    const int64_t num_segments = static_cast<int64_t>(num_segments_t.scalar<Index>()());
    OP_REQUIRES(ctx, num_segments >= 0,
                absl::InvalidArgumentError(
                    absl::StrCat("num_segments must be >= 0, got ", num_segments)));
    const int64_t n = values.dim_size(0);
    const Index* segment = segment_ids.flat<Index>().data();
    const int64_t bad = FirstSegmentOutOfRange(segment, n, num_segments);
    OP_REQUIRES(ctx, bad < 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "segment_ids[", bad, "] = ", bad < 0 ? 0 : static_cast<int64_t>(segment[bad]),
                    " is not in [0, num_segments = ", num_segments, ")")));
    TensorShape sums_shape = values.shape();
    OP_REQUIRES_OK(ctx, sums_shape.SetDimWithStatus(0, num_segments));
    Tensor* sums = nullptr;
    Tensor* counts = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, sums_shape, &sums));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({num_segments}), &counts));
    if (num_segments == 0) return;
    int64_t width = 1;  // elements per row (also when there are no rows)
    for (int d = 1; d < values.dims(); ++d) width *= values.dim_size(d);
    const T* rows = values.flat<T>().data();
    T* out = sums->flat<T>().data();
    Index* count = counts->flat<Index>().data();
    // Each block of segments scans every id and adds the rows of its own, so each
    // segment's rows still add up in row order. A training step's gradient (~100k
    // rows of 16) is summed in one pass on this thread: every block pays a scan of
    // all ids with an unpredictable branch per id, and TF's cost model cut such a
    // sum into 4 blocks per thread, which took 3.6 ms of a steady shared step where
    // one pass takes ~1 (docs/benchmarks.md, "Cost per id"). Larger sums use one
    // block per thread.
    auto* pool = ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t blocks =
        n * width < kParallelSumElements ? 1 : std::min<int64_t>(pool->num_threads, num_segments);
    const auto sum_blocks = [&](int64_t first_block, int64_t last_block) {
      for (int64_t b = first_block; b < last_block; ++b) {
        SumSegments(rows, segment, n, width, num_segments * b / blocks,
                    num_segments * (b + 1) / blocks, out, count);
      }
    };
    if (blocks <= 1) {
      sum_blocks(0, 1);
    } else {
      // One block per task (the cost only has to be high enough for TF to split).
      tensorflow::Shard(blocks, pool->workers, blocks, /*cost_per_unit=*/1 << 20, sum_blocks);
    }
  }

 private:
  // Below this many values (rows x width) the sum runs in one pass on one thread.
  static constexpr int64_t kParallelSumElements = int64_t{1} << 22;
};

#define DYNEMB_REGISTER_UNIQUE(K, Index)                                     \
  REGISTER_KERNEL_BUILDER(Name("DynembUnique")                               \
                              .Device(tensorflow::DEVICE_CPU)                \
                              .TypeConstraint<K>("Tkey")                     \
                              .TypeConstraint<Index>("out_idx"),             \
                          (UniqueOp<K, Index>));
#define DYNEMB_REGISTER_SEGMENT_SUM(T, Index)                                \
  REGISTER_KERNEL_BUILDER(Name("DynembSegmentSum")                           \
                              .Device(tensorflow::DEVICE_CPU)                \
                              .TypeConstraint<T>("T")                        \
                              .TypeConstraint<Index>("Tidx")                 \
                              .HostMemory("num_segments"),                   \
                          (SegmentSumOp<T, Index>));

DYNEMB_REGISTER_UNIQUE(int32_t, int32_t)
DYNEMB_REGISTER_UNIQUE(int32_t, int64_t)
DYNEMB_REGISTER_UNIQUE(int64_t, int32_t)
DYNEMB_REGISTER_UNIQUE(int64_t, int64_t)
DYNEMB_REGISTER_SEGMENT_SUM(float, int32_t)
DYNEMB_REGISTER_SEGMENT_SUM(float, int64_t)
DYNEMB_REGISTER_SEGMENT_SUM(double, int32_t)
DYNEMB_REGISTER_SEGMENT_SUM(double, int64_t)

#undef DYNEMB_REGISTER_UNIQUE
#undef DYNEMB_REGISTER_SEGMENT_SUM

}  // namespace
}  // namespace dynemb
