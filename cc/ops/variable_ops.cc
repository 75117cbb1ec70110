// Ops the Variable layer builds on (no table handle): key -> shard routing and
// key-seeded initial rows. Both compute functions of cc/core/partition.h,
// which are the same on every machine and TF build.

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace dynemb {
namespace {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

absl::Status PartitionShape(InferenceContext* c) {
  ShapeHandle num_shards;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &num_shards));
  c->set_output(0, c->input(0));
  return absl::OkStatus();
}

absl::Status KeyedRandomShape(InferenceContext* c) {
  int64_t dim = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  ShapeHandle out;
  TF_RETURN_IF_ERROR(c->Concatenate(c->input(0), c->Vector(dim), &out));
  c->set_output(0, out);
  return absl::OkStatus();
}

// (values, exists, keys): values is keys.shape + [dim], exists keys.shape.
absl::Status KeyedRandomFillShape(InferenceContext* c) {
  int64_t dim = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  ShapeHandle keyed, rows, exists;
  TF_RETURN_IF_ERROR(c->Concatenate(c->input(2), c->Vector(dim), &keyed));
  TF_RETURN_IF_ERROR(c->Merge(c->input(0), keyed, &rows));
  TF_RETURN_IF_ERROR(c->Merge(c->input(1), c->input(2), &exists));
  c->set_output(0, rows);
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("DynembPartition")
    .Input("keys: Tkey")
    .Input("num_shards: int32")
    .Output("shard_ids: int32")
    .Attr("Tkey: {int32, int64, string}")
    .SetShapeFn(PartitionShape)
    .Doc(R"doc(
The shard in [0, num_shards) of each key: a stable hash of the key (int32 keys
widened to int64 first), the same on every machine and TF build.
)doc");

// What a key's drawn row depends on besides the key: the same for both ops, so
// that DynembKeyedRandomFill draws DynembKeyedRandom's rows.
#define DYNEMB_KEYED_RANDOM_ATTRS                                       \
  .Attr("Tkey: {int32, int64, string}")                                 \
  .Attr("dim: int >= 1")                                                \
  .Attr("seed: int")                                                    \
  .Attr("distribution: {'uniform', 'normal', 'truncated_normal'}")      \
  .Attr("a: float")                                                     \
  .Attr("b: float")                                                     \
  .Attr("dtype: {float, double}")

REGISTER_OP("DynembKeyedRandom")
    .Input("keys: Tkey")
    .Output("rows: dtype")
    DYNEMB_KEYED_RANDOM_ATTRS
    .SetShapeFn(KeyedRandomShape)
    .Doc(R"doc(
keys.shape + [dim] random rows, each depending only on (seed, key): uniform in
[a, b), or normal / truncated normal (within 2 stddevs) of mean a, stddev b.
)doc");

REGISTER_OP("DynembKeyedRandomFill")
    .Input("values: dtype")
    .Input("exists: bool")
    .Input("keys: Tkey")
    .Output("filled: dtype")
    DYNEMB_KEYED_RANDOM_ATTRS
    .SetShapeFn(KeyedRandomFillShape)
    .Doc(R"doc(
`values` (keys.shape + [dim]) with the row of every key whose `exists` is false
replaced by DynembKeyedRandom's row of that key (same attrs, same row): what a
lookup returns once the keys it missed get their initial rows.
)doc");

#undef DYNEMB_KEYED_RANDOM_ATTRS

}  // namespace dynemb
