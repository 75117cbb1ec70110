// Shape-function helpers shared by the op registrations of cc/ops.

#ifndef DYNEMB_OPS_SHAPE_FNS_H_
#define DYNEMB_OPS_SHAPE_FNS_H_

#include "absl/status/status.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace dynemb {

// Inputs [first, last] are scalars.
inline absl::Status Scalars(tensorflow::shape_inference::InferenceContext* c, int first,
                            int last) {
  for (int i = first; i <= last; ++i) {
    tensorflow::shape_inference::ShapeHandle unused;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
  }
  return absl::OkStatus();
}

// The shape function of the ops that create a table (DynembHashTable,
// DynembRedisTable): a scalar handle carrying the key and value dtypes and
// the value shape (attrs key_dtype, value_dtype, value_shape).
absl::Status TableHandleShape(tensorflow::shape_inference::InferenceContext* c);

}  // namespace dynemb

#endif  // DYNEMB_OPS_SHAPE_FNS_H_
