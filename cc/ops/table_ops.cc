// Op registrations for dynamic-embedding tables: REGISTER_OP and named shape
// functions only. Kernels live in cc/kernels/.
//
// Every op that reads or writes a table takes the table's resource handle. The
// create op records the value shape in the handle's shapes-and-types, so the
// shape functions below can check value tensors at graph-construction time.

#include "tensorflow/core/framework/common_shape_fns.h"
#include "cc/ops/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace dynemb {
namespace {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeAndType;
using ::tensorflow::shape_inference::ShapeHandle;

constexpr char kKeyTypes[] = "{int32, int64, string}";
constexpr char kValueTypes[] = "{float, double, half, bfloat16, int8, int32, int64, bool}";

std::string TypeAttr(const char* name, const char* types) {
  return std::string(name) + ": " + types;
}

// The value shape recorded in the table handle, or unknown.
ShapeHandle ValueShapeOfHandle(InferenceContext* c) {
  const auto* handle_data = c->input_handle_shapes_and_types(0);
  if (handle_data == nullptr || handle_data->size() != 2) return c->UnknownShape();
  return (*handle_data)[1].shape;
}

// Checks that `actual` is compatible with `expected`; the error message says
// "Expected shape" so users and tests can recognise it in any mode.
absl::Status CheckShape(InferenceContext* c, ShapeHandle expected, ShapeHandle actual,
                        const char* what) {
  ShapeHandle unused;
  if (!c->Merge(expected, actual, &unused).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("Expected shape ", c->DebugString(expected),
                                                   " for ", what, ", got ",
                                                   c->DebugString(actual)));
  }
  return absl::OkStatus();
}

// keys.shape + value_shape.
absl::Status KeyedValueShape(InferenceContext* c, ShapeHandle keys, ShapeHandle* out) {
  return c->Concatenate(keys, ValueShapeOfHandle(c), out);
}

absl::Status CreateTableShape(InferenceContext* c) {
  tensorflow::PartialTensorShape value_p;
  TF_RETURN_IF_ERROR(c->GetAttr("value_shape", &value_p));
  tensorflow::DataType key_dtype, value_dtype;
  TF_RETURN_IF_ERROR(c->GetAttr("key_dtype", &key_dtype));
  TF_RETURN_IF_ERROR(c->GetAttr("value_dtype", &value_dtype));
  if (!value_p.IsFullyDefined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("value_shape must be fully defined, got ", value_p.DebugString()));
  }
  if (value_p.num_elements() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "value_shape must have at least one element (dim >= 1), got ", value_p.DebugString()));
  }
  ShapeHandle value_shape;
  TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(value_p, &value_shape));
  c->set_output(0, c->Scalar());
  c->set_output_handle_shapes_and_types(
      0, std::vector<ShapeAndType>{{c->Scalar(), key_dtype}, {value_shape, value_dtype}});
  return absl::OkStatus();
}

absl::Status FindShape(InferenceContext* c) {
  ShapeHandle handle;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &handle));
  ShapeHandle keys = c->input(1);
  ShapeHandle values;
  TF_RETURN_IF_ERROR(KeyedValueShape(c, keys, &values));
  // The default is one row (broadcast) or one row per key.
  ShapeHandle defaults = c->input(2);
  ShapeHandle value_shape = ValueShapeOfHandle(c);
  if (c->RankKnown(defaults) && c->RankKnown(value_shape) && c->RankKnown(keys) &&
      c->Rank(defaults) != c->Rank(value_shape)) {
    TF_RETURN_IF_ERROR(CheckShape(c, values, defaults, "default_value"));
  } else if (c->RankKnown(defaults) && c->RankKnown(value_shape) &&
             c->Rank(defaults) == c->Rank(value_shape)) {
    TF_RETURN_IF_ERROR(CheckShape(c, value_shape, defaults, "default_value"));
  }
  c->set_output(0, values);
  c->set_output(1, keys);
  return absl::OkStatus();
}

// Checks (handle, keys, values[, third input shaped like keys or empty]).
absl::Status KeysAndValuesShape(InferenceContext* c, const char* third_name) {
  ShapeHandle handle;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &handle));
  ShapeHandle keys = c->input(1);
  ShapeHandle expected;
  TF_RETURN_IF_ERROR(KeyedValueShape(c, keys, &expected));
  TF_RETURN_IF_ERROR(CheckShape(c, expected, c->input(2), "values"));
  if (third_name != nullptr && c->num_inputs() > 3) {
    ShapeHandle third = c->input(3);
    // Scores may be empty ([0]) to mean "let the table assign them".
    bool empty = c->RankKnown(third) && c->Rank(third) == 1 &&
                 c->ValueKnown(c->Dim(third, 0)) && c->Value(c->Dim(third, 0)) == 0;
    if (!empty) TF_RETURN_IF_ERROR(CheckShape(c, keys, third, third_name));
  }
  return absl::OkStatus();
}

absl::Status InsertShape(InferenceContext* c) { return KeysAndValuesShape(c, "scores"); }

absl::Status AccumShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(KeysAndValuesShape(c, nullptr));
  return CheckShape(c, c->input(1), c->input(3), "exists");
}

absl::Status HandleOnlyShape(InferenceContext* c) {
  ShapeHandle handle;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &handle));
  return absl::OkStatus();
}

absl::Status RemoveShape(InferenceContext* c) { return HandleOnlyShape(c); }

absl::Status SizeShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(HandleOnlyShape(c));
  c->set_output(0, c->Scalar());
  return absl::OkStatus();
}

// Outputs (keys [m], values [m] + value_shape, scores [m]) of an unknown m.
absl::Status EntriesOutputsShape(InferenceContext* c) {
  ShapeHandle keys = c->Vector(c->UnknownDim());
  ShapeHandle values;
  TF_RETURN_IF_ERROR(KeyedValueShape(c, keys, &values));
  c->set_output(0, keys);
  c->set_output(1, values);
  c->set_output(2, keys);
  return absl::OkStatus();
}

absl::Status ExportShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(HandleOnlyShape(c));
  return EntriesOutputsShape(c);
}

absl::Status InsertAndEvictShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(InsertShape(c));
  return EntriesOutputsShape(c);
}

absl::Status AccumAndEvictShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(AccumShape(c));
  return EntriesOutputsShape(c);
}

// (handle, keys [n], rows [n, dim], grads [n, dim], initial value_shape,
// coefficients [k]) -> new rows [n, dim].
absl::Status ApplyRuleShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(HandleOnlyShape(c));
  ShapeHandle keys, rows, grads, coefficients;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &rows));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 1, &coefficients));
  ShapeHandle keyed_rows;
  TF_RETURN_IF_ERROR(c->Concatenate(keys, c->Vector(c->Dim(rows, 1)), &keyed_rows));
  TF_RETURN_IF_ERROR(CheckShape(c, keyed_rows, rows, "rows"));
  TF_RETURN_IF_ERROR(CheckShape(c, rows, c->input(3), "grads"));
  TF_RETURN_IF_ERROR(CheckShape(c, ValueShapeOfHandle(c), c->input(4), "initial"));
  ShapeHandle out;
  TF_RETURN_IF_ERROR(c->Merge(rows, c->input(3), &out));
  c->set_output(0, out);
  return absl::OkStatus();
}

absl::Status StatsShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(HandleOnlyShape(c));
  for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->Scalar());
  return absl::OkStatus();
}

}  // namespace

absl::Status TableHandleShape(InferenceContext* c) { return CreateTableShape(c); }

REGISTER_OP("DynembHashTable")
    .Output("table_handle: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("use_node_name_sharing: bool = false")
    .Attr("anonymous: bool = false")
    .Attr(TypeAttr("key_dtype", kKeyTypes))
    .Attr(TypeAttr("value_dtype", kValueTypes))
    .Attr("value_shape: shape = {}")
    .Attr("init_capacity: int >= 0 = 0")
    .Attr("max_capacity: int >= 0 = 0")
    .Attr("evict_strategy: {'lru', 'lfu', 'epoch_lru', 'epoch_lfu', 'customized'} = 'lru'")
    .Attr("step_per_epoch: int >= 0 = 0")
    .Attr("find_updates_scores: bool = false")
    .Attr("max_hbm_for_values: int >= -1 = -1")
    .Attr("track_changes: bool = true")
    .SetIsStateful()
    .SetShapeFn(CreateTableShape)
    .Doc(R"doc(
Creates a dynamic-embedding hash table and returns its handle.

With `anonymous`, the handle is ref-counted and the table lives as long as a
handle to it does. Otherwise the table lives in the resource manager under
`container`/`shared_name` (or the node name with `use_node_name_sharing`).
max_capacity: 0 for an unbounded table.
max_hbm_for_values: GPU tables: bytes of device memory for value rows, the rest
  in pinned host memory the GPU reads over the bus; -1: all in device memory.
  CPU tables ignore it.
track_changes: keep write stamps and tombstones, so that a DeltaExporter can
  write only what changed (cc/core/table.h, "Change tracking"); false saves 8
  bytes per key of an unbounded table. GPU tables ignore it.
)doc");

REGISTER_OP("DynembTableFind")
    .Input("table_handle: resource")
    .Input("keys: Tkey")
    .Input("default_value: Tvalue")
    .Output("values: Tvalue")
    .Output("exists: bool")
    .Attr(TypeAttr("Tkey", kKeyTypes))
    .Attr(TypeAttr("Tvalue", kValueTypes))
    .Attr("update_scores: bool = true")
    .SetShapeFn(FindShape)
    .Doc(R"doc(
Looks up keys of any shape. `default_value` is one row (value_shape, broadcast
to every missing key) or keys.shape + value_shape. `update_scores` false leaves
every score unchanged (a read-only lookup), even in a table whose lookups
refresh LRU scores.
)doc");

REGISTER_OP("DynembTableInsert")
    .Input("table_handle: resource")
    .Input("keys: Tkey")
    .Input("values: Tvalue")
    .Input("scores: int64")
    .Attr(TypeAttr("Tkey", kKeyTypes))
    .Attr(TypeAttr("Tvalue", kValueTypes))
    .SetShapeFn(InsertShape)
    .Doc(R"doc(
Upserts keys with values (keys.shape + value_shape). `scores` is keys.shape to
set scores explicitly, or shape [0] to let the table's strategy assign them.
)doc");

REGISTER_OP("DynembTableInsertAndEvict")
    .Input("table_handle: resource")
    .Input("keys: Tkey")
    .Input("values: Tvalue")
    .Input("scores: int64")
    .Output("evicted_keys: Tkey")
    .Output("evicted_values: Tvalue")
    .Output("evicted_scores: int64")
    .Attr(TypeAttr("Tkey", kKeyTypes))
    .Attr(TypeAttr("Tvalue", kValueTypes))
    .SetShapeFn(InsertAndEvictShape)
    .Doc(R"doc(
DynembTableInsert that also returns what the batch evicted to stay within the
table's max_capacity: the stored entries it evicted and the new keys it turned
away because their score was below every stored score, m <= keys.size entries
in unspecified order (m = 0 for an unbounded table).
)doc");

REGISTER_OP("DynembTableAccum")
    .Input("table_handle: resource")
    .Input("keys: Tkey")
    .Input("values_or_deltas: Tvalue")
    .Input("exists: bool")
    .Attr(TypeAttr("Tkey", kKeyTypes))
    .Attr(TypeAttr("Tvalue", kValueTypes))
    .SetShapeFn(AccumShape)
    .Doc(R"doc(
Per key: exists and present -> value += delta; not exists and absent -> insert
the value; otherwise no change.
)doc");

REGISTER_OP("DynembTableApplyRule")
    .Input("table_handle: resource")
    .Input("keys: Tkey")
    .Input("rows: Tvalue")
    .Input("grads: Tvalue")
    .Input("initial: Tvalue")
    .Input("coefficients: Tvalue")
    .Output("new_rows: Tvalue")
    .Attr(TypeAttr("Tkey", kKeyTypes))
    .Attr("Tvalue: {float, double}")
    .Attr("rule: {'keras_adam', 'adam_kernel', 'keras_adagrad', 'adagrad_v2', "
          "'keras_momentum', 'keras_nesterov', 'momentum', 'nesterov', "
          "'keras_adam_amsgrad', 'keras_adamax', 'keras_rmsprop', 'keras_rmsprop_momentum', "
          "'keras_rmsprop_centered', 'keras_rmsprop_centered_momentum', 'keras_adadelta', "
          "'keras_nadam'}")
    .Attr("weight_decay: bool = false")
    .SetShapeFn(ApplyRuleShape)
    .Doc(R"doc(
One optimizer step on a slot-state table (its rows: a key's slots side by side,
value_shape [slots * dim]): per key, the state row -- `initial` for a key the
table lacks, which is then inserted -- is updated in place by `rule` from the
parameter row `rows[i]` and its gradient `grads[i]` ([n, dim]), and
`new_rows[i]` receives the updated parameter row. Each key's read, update and
write are atomic. `coefficients` are the rule's per-step scalars
(cc/core/update_rules.h), preceded by [weight_decay, lr] with `weight_decay`.
The table must be unbounded.
)doc");

REGISTER_OP("DynembTableAccumAndEvict")
    .Input("table_handle: resource")
    .Input("keys: Tkey")
    .Input("values_or_deltas: Tvalue")
    .Input("exists: bool")
    .Output("evicted_keys: Tkey")
    .Output("evicted_values: Tvalue")
    .Output("evicted_scores: int64")
    .Attr(TypeAttr("Tkey", kKeyTypes))
    .Attr(TypeAttr("Tvalue", kValueTypes))
    .SetShapeFn(AccumAndEvictShape)
    .Doc(R"doc(
DynembTableAccum that also returns what the batch evicted to stay within the
table's max_capacity, as DynembTableInsertAndEvict does: the stored entries
it evicted and the new keys it turned away (with the value they would have
been inserted with), m <= keys.size entries in unspecified order (m = 0 for
an unbounded table).
)doc");

REGISTER_OP("DynembTableRemove")
    .Input("table_handle: resource")
    .Input("keys: Tkey")
    .Attr(TypeAttr("Tkey", kKeyTypes))
    .SetShapeFn(RemoveShape);

REGISTER_OP("DynembTableClear")
    .Input("table_handle: resource")
    .SetShapeFn(HandleOnlyShape);

REGISTER_OP("DynembTableSize")
    .Input("table_handle: resource")
    .Output("size: int64")
    .SetShapeFn(SizeShape);

REGISTER_OP("DynembTableStats")
    .Input("table_handle: resource")
    .Output("size: int64")
    .Output("capacity: int64")
    .Output("max_capacity: int64")
    .Output("load_factor: float")
    .Output("inserts: int64")
    .Output("lookups: int64")
    .Output("misses: int64")
    .Output("evictions: int64")
    .SetShapeFn(StatsShape)
    .Doc(R"doc(
Scalars describing the table.
size: keys stored.
capacity: keys the table holds before its slot arrays grow; a bounded table's
  capacity grows up to max_capacity.
max_capacity: 0 for an unbounded table.
load_factor: size / capacity.
inserts: rows that created a key, since the table was created.
lookups: keys looked up.
misses: keys looked up and absent.
evictions: entries evicted, and new keys turned away, to stay within
  max_capacity.
)doc");

REGISTER_OP("DynembTableExport")
    .Input("table_handle: resource")
    .Output("keys: Tkey")
    .Output("values: Tvalue")
    .Output("scores: int64")
    .Attr(TypeAttr("Tkey", kKeyTypes))
    .Attr(TypeAttr("Tvalue", kValueTypes))
    .Attr("with_scores: bool = true")
    .SetShapeFn(ExportShape)
    .Doc(R"doc(
Every entry: keys [n], values [n] + value_shape and, with `with_scores`, their
scores [n] (else an empty [0], and the scores are never copied).
)doc");

REGISTER_OP("DynembTableImport")
    .Input("table_handle: resource")
    .Input("keys: Tkey")
    .Input("values: Tvalue")
    .Input("scores: int64")
    .Attr(TypeAttr("Tkey", kKeyTypes))
    .Attr(TypeAttr("Tvalue", kValueTypes))
    .Attr("restore: bool = false")
    .SetShapeFn(InsertShape)
    .Doc(R"doc(
Replaces the whole content of the table (scores as in DynembTableInsert).
restore: the import is a checkpoint's or SavedModel's restore. A table whose content
checkpoints do not keep is then left as it is: a Redis table whose config, read where
the table was created, has table_store_mode 2 (a serving process that shares the
trainer's Redis must not write the rows of the export back into it).
)doc");

}  // namespace dynemb
