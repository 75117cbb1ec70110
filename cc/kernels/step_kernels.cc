// CPU kernels of cc/ops/step_ops.cc over cc/core/dedup.h.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cc/core/dedup.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
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
    Tensor unique, slots;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(keys.dtype(), keys.shape(), &unique));
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT32, TensorShape({DedupSlots(n)}), &slots));
    const int64_t m = DedupKeys(keys.flat<K>().data(), n, unique.flat<K>().data(),
                                index->flat<Index>().data(), slots.flat<int32_t>().data());
    ctx->set_output(0, unique.Slice(0, m));
  }
};

// The trainable view's read of a lookup's rows from its rows buffer (a resource
// variable): what ResourceGather does, faster. TF's gather copies each row with a
// call to memcpy of a runtime size and no prefetch; a steady shared training step
// (106,496 rows of 16 floats from a buffer of ~51k) spent ~3 ms in it, ~20% of the
// embedding's time (docs/benchmarks.md, issue 35). Here each block of rows
// prefetches the source rows it copies next, and common row sizes are copied with
// constant-size copies.
template <typename T, typename Index>
class GatherRowsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    tensorflow::core::RefCountPtr<tensorflow::Var> var;
    OP_REQUIRES_OK(ctx, tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, 0), &var));
    const Tensor& indices = ctx->input(1);
    OP_REQUIRES(ctx, tensorflow::TensorShapeUtils::IsVector(indices.shape()),
                absl::InvalidArgumentError(absl::StrCat("indices must be a vector, got shape ",
                                                        indices.shape().DebugString())));
    // Held while the rows are copied: an assignment replaces the buffer under the
    // exclusive lock, so the copy reads one buffer throughout.
    tensorflow::tf_shared_lock lock(*var->mu());
    OP_REQUIRES(ctx, var->is_initialized,
                absl::FailedPreconditionError("the resource variable is not initialized"));
    const Tensor& params = *var->tensor();
    OP_REQUIRES(ctx, params.dtype() == tensorflow::DataTypeToEnum<T>::v(),
                absl::InvalidArgumentError(absl::StrCat(
                    "dtype: the op reads ", tensorflow::DataTypeString(tensorflow::DataTypeToEnum<T>::v()),
                    " but the variable holds ", tensorflow::DataTypeString(params.dtype()))));
    OP_REQUIRES(ctx, params.dims() >= 1,
                absl::InvalidArgumentError(absl::StrCat(
                    "the variable must have rank >= 1, got shape ", params.shape().DebugString())));
    const int64_t rows = params.dim_size(0);
    const int64_t n = indices.NumElements();
    const Index* index = indices.flat<Index>().data();
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, index[i] >= 0 && static_cast<int64_t>(index[i]) < rows,
                  absl::InvalidArgumentError(absl::StrCat("indices[", i, "] = ",
                                                          static_cast<int64_t>(index[i]),
                                                          " is not in [0, ", rows, ")")));
    }
    TensorShape out_shape = params.shape();
    OP_REQUIRES_OK(ctx, out_shape.SetDimWithStatus(0, n));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &out));
    if (n == 0 || out->NumElements() == 0) return;
    const size_t row_bytes = static_cast<size_t>(out->NumElements() / n) * sizeof(T);
    const char* src = reinterpret_cast<const char*>(params.flat<T>().data());
    char* dst = reinterpret_cast<char*>(out->flat<T>().data());
    const auto copy_rows = [&](int64_t first, int64_t last) {
      switch (row_bytes) {
        case 32: return CopyRows<32>(src, index, first, last, 32, dst);
        case 64: return CopyRows<64>(src, index, first, last, 64, dst);
        case 128: return CopyRows<128>(src, index, first, last, 128, dst);
        case 256: return CopyRows<256>(src, index, first, last, 256, dst);
        default: return CopyRows<0>(src, index, first, last, row_bytes, dst);
      }
    };
    if (n < kParallelMinRows) {
      // A per-feature table's read (a batch's rows, one feature): tens of
      // microseconds, less than handing half of it to a pool thread costs when a
      // step runs many such ops at once (issue 35: 206 us per op before).
      copy_rows(0, n);
      return;
    }
    auto* pool = ctx->device()->tensorflow_cpu_worker_threads();
    // ~2 cache misses' worth of cycles per row, so that TF splits large reads.
    tensorflow::Shard(pool->num_threads, pool->workers, n, /*cost_per_unit=*/200 + row_bytes,
                      copy_rows);
  }

 private:
  static constexpr int64_t kPrefetchRows = 8;
  // Below this many rows the calling thread copies them all (one miss per row:
  // about the work of the core table's 4,096-key parallel threshold, two misses
  // per key).
  static constexpr int64_t kParallelMinRows = 8192;

  // Copies rows index[first .. last) of `src` to rows first .. last of `dst`;
  // kBytes > 0 is row_bytes as a constant (inlined copies).
  template <size_t kBytes>
  static void CopyRows(const char* src, const Index* index, int64_t first, int64_t last,
                       size_t row_bytes, char* dst) {
    const size_t bytes = kBytes > 0 ? kBytes : row_bytes;
    for (int64_t i = first; i < last; ++i) {
      if (i + kPrefetchRows < last) {
        const char* ahead = src + static_cast<size_t>(index[i + kPrefetchRows]) * bytes;
        for (size_t line = 0; line < bytes && line < 4 * 64; line += 64) __builtin_prefetch(ahead + line);
      }
      std::memcpy(dst + static_cast<size_t>(i) * bytes, src + static_cast<size_t>(index[i]) * bytes,
                  bytes);
    }
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

#define DYNEMB_REGISTER_GATHER_ROWS(T, Index)                                \
  REGISTER_KERNEL_BUILDER(Name("DynembGatherRows")                           \
                              .Device(tensorflow::DEVICE_CPU)                \
                              .TypeConstraint<T>("dtype")                    \
                              .TypeConstraint<Index>("Tindices"),            \
                          (GatherRowsOp<T, Index>));

DYNEMB_REGISTER_UNIQUE(int32_t, int32_t)
DYNEMB_REGISTER_UNIQUE(int32_t, int64_t)
DYNEMB_REGISTER_UNIQUE(int64_t, int32_t)
DYNEMB_REGISTER_UNIQUE(int64_t, int64_t)
DYNEMB_REGISTER_SEGMENT_SUM(float, int32_t)
DYNEMB_REGISTER_SEGMENT_SUM(float, int64_t)
DYNEMB_REGISTER_SEGMENT_SUM(double, int32_t)
DYNEMB_REGISTER_SEGMENT_SUM(double, int64_t)
DYNEMB_REGISTER_GATHER_ROWS(float, int32_t)
DYNEMB_REGISTER_GATHER_ROWS(float, int64_t)
DYNEMB_REGISTER_GATHER_ROWS(double, int32_t)
DYNEMB_REGISTER_GATHER_ROWS(double, int64_t)

#undef DYNEMB_REGISTER_UNIQUE
#undef DYNEMB_REGISTER_SEGMENT_SUM
#undef DYNEMB_REGISTER_GATHER_ROWS

}  // namespace
}  // namespace dynemb
