// Ops of the training step (no table handle): the trainable view's
// deduplication of a batch's ids, its gather of the rows of a lookup from its
// rows buffer, and the optimizer's per-id gradient sums. Their kernels
// (cc/kernels/step_kernels.cc) run cc/core/dedup.h.

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace dynemb {
namespace {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

absl::Status UniqueShape(InferenceContext* c) {
  ShapeHandle keys;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
  c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
  c->set_output(1, keys);
  return absl::OkStatus();
}

absl::Status SegmentSumShape(InferenceContext* c) {
  ShapeHandle values, segment_ids, num_segments_shape;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &values));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &segment_ids));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &num_segments_shape));
  DimensionHandle unused;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(values, 0), c->Dim(segment_ids, 0), &unused));
  DimensionHandle num_segments;
  TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(2, &num_segments));
  ShapeHandle row, sums;
  TF_RETURN_IF_ERROR(c->Subshape(values, 1, &row));
  TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(num_segments), row, &sums));
  c->set_output(0, sums);
  c->set_output(1, c->Vector(num_segments));
  return absl::OkStatus();
}

absl::Status GatherRowsShape(InferenceContext* c) {
  ShapeHandle indices;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &indices));
  // The variable's shape, where its handle carries it (as ResourceGather reads it).
  const auto* handle_data = c->input_handle_shapes_and_types(0);
  if (handle_data == nullptr || handle_data->empty()) {
    c->set_output(0, c->UnknownShape());
    return absl::OkStatus();
  }
  ShapeHandle params, row, out;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast((*handle_data)[0].shape, 1, &params));
  TF_RETURN_IF_ERROR(c->Subshape(params, 1, &row));
  TF_RETURN_IF_ERROR(c->Concatenate(indices, row, &out));
  c->set_output(0, out);
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("DynembGatherRows")
    .Input("resource: resource")
    .Input("indices: Tindices")
    .Output("rows: dtype")
    .Attr("dtype: {float, double}")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn(GatherRowsShape)
    .Doc(R"doc(
ResourceGather of the rows `indices` (a vector) of a resource variable of rank
>= 1, on the CPU: the rows copied with prefetching of the rows read next, on
the calling thread below 8,192 rows and in parallel blocks above. Its gradient is ResourceGather's (tensorflow_dynemb.variable.step_ops).
)doc");

REGISTER_OP("DynembUnique")
    .Input("keys: Tkey")
    .Output("unique_keys: Tkey")
    .Output("index: out_idx")
    .Attr("Tkey: {int32, int64}")
    .Attr("out_idx: {int32, int64} = DT_INT32")
    .SetShapeFn(UniqueShape)
    .Doc(R"doc(
tf.unique for integer keys: the distinct keys in order of first occurrence, and
for each key its position among them.
)doc");

REGISTER_OP("DynembSegmentSum")
    .Input("values: T")
    .Input("segment_ids: Tidx")
    .Input("num_segments: Tidx")
    .Output("sums: T")
    .Output("counts: Tidx")
    .Attr("T: {float, double}")
    .Attr("Tidx: {int32, int64}")
    .SetShapeFn(SegmentSumShape)
    .Doc(R"doc(
tf.math.unsorted_segment_sum of values (rows along the first axis) into
num_segments rows, added in row order, plus the number of rows per segment.
)doc");

}  // namespace dynemb
