// Op registrations of online learning's delta files (cc/kernels/delta_kernels.cc;
// the format: cc/core/delta.h). A write (DeltaExporter.write): one
// DynembTableWriteChanges per shard table and one DynembSaveDense per dense
// variable, then DynembWriteDeltaManifest, which commits them. Serving
// (de.serving.DeltaUpdater): DynembApplyDeltas applies the committed
// generations a model has not applied yet; DynembDeltaState says where a
// directory stands.

#include "cc/ops/shape_fns.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace dynemb {
namespace {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

absl::Status WriteChangesShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(Scalars(c, 0, 5));
  ShapeHandle since;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(6), 1, &since));
  TF_RETURN_IF_ERROR(Scalars(c, 7, 7));
  c->set_output(0, c->Vector(2));
  c->set_output(1, c->Vector(2));
  c->set_output(2, c->Scalar());
  return absl::OkStatus();
}

absl::Status SaveDenseShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(Scalars(c, 0, 4));
  c->set_output(0, c->Scalar());
  return absl::OkStatus();
}

absl::Status WriteDeltaManifestShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(Scalars(c, 0, 4));
  ShapeHandle lines;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 1, &lines));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(6), 1, &lines));
  c->set_output(0, c->Scalar());
  return absl::OkStatus();
}

absl::Status DeltaStateShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(Scalars(c, 0, 0));
  for (int i = 0; i < 4; ++i) c->set_output(i, c->Scalar());
  c->set_output(4, c->Vector(c->UnknownDim()));
  return absl::OkStatus();
}

absl::Status ApplyDeltasShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(Scalars(c, 0, 3));
  for (int i = 0; i < 4; ++i) c->set_output(i, c->Scalar());
  // The dense outputs have the shapes of the dense inputs.
  const int num_tables = c->num_inputs() - 4 - (c->num_outputs() - 4);
  for (int i = 4; i < c->num_outputs(); ++i) c->set_output(i, c->input(4 + num_tables + i - 4));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("DynembTableWriteChanges")
    .Input("table_handle: resource")
    .Input("dirpath: string")
    .Input("save_id: string")
    .Input("base_serial: int64")
    .Input("sequence: int64")
    .Input("item: int64")
    .Input("since: int64")
    .Input("full: bool")
    .Output("entries: string")
    .Output("until: int64")
    .Output("wrote_full: bool")
    .Attr("chunk_rows: int >= 1 = 65536")
    .Attr("shard_index: int >= 0 = 0")
    .Attr("num_shards: int >= 1 = 1")
    .Attr("routed: bool = false")
    .Attr("sync: bool = true")
    .SetIsStateful()
    .SetShapeFn(WriteChangesShape)
    .Doc(R"doc(
Writes one shard table's part of a delta generation (cc/core/delta.h).

Takes the table's current mark `until` (Table::Mark). Unless `full`, writes the
changes of the window [since, until): the rows written in it (role `rows`, key |
values) and the keys removed or evicted in it (role `removed`); when the table
cannot tell (`since` of another epoch, tombstones dropped since, see
cc/core/table.h), or with `full`, writes the whole table instead (role `full`,
with scores) and sets `wrote_full`; so it does for a table that does not track
changes (made with track_changes false, or a GPU table), whose `until` is then 0, 0. Files are named by base_serial, sequence,
item, role and shard_index, with the save id; they are synced with `sync`.
entries: the manifest's file entries "role shard name bytes rows digest"; the
second is "" for a full write.
since, until: marks, as two int64 (epoch, stamp) bit-cast from uint64.
)doc");

REGISTER_OP("DynembSaveDense")
    .Input("dirpath: string")
    .Input("save_id: string")
    .Input("base_serial: int64")
    .Input("sequence: int64")
    .Input("item: int64")
    .Input("value: T")
    .Output("entry: string")
    .Attr("T: {float, double, half, bfloat16, int8, int32, int64, bool}")
    .Attr("sync: bool = true")
    .SetIsStateful()
    .SetShapeFn(SaveDenseShape)
    .Doc(R"doc(
Writes a dense variable's value as a delta file of role `dense`: one row of key
0 whose dim is the value's element count (table file format, no score).
entry: "dense 0 name bytes rows digest".
)doc");

REGISTER_OP("DynembWriteDeltaManifest")
    .Input("dirpath: string")
    .Input("base_id: string")
    .Input("save_id: string")
    .Input("base_serial: int64")
    .Input("sequence: int64")
    .Input("items: string")
    .Input("files: string")
    .Output("manifest: string")
    .Attr("sync: bool = true")
    .SetIsStateful()
    .SetShapeFn(WriteDeltaManifestShape)
    .Doc(R"doc(
Commits a delta generation: checks the manifest made of `items` (its item
lines) and `files` ("<item> " + an entry of DynembTableWriteChanges or
DynembSaveDense), writes it aside, syncs it and renames it into place, then
deletes what no committed manifest of the newest base names (the files of
older bases and of killed writes). Returns the manifest's name.
)doc");

REGISTER_OP("DynembDeltaState")
    .Input("dirpath: string")
    .Output("base_id: string")
    .Output("base_serial: int64")
    .Output("sequence: int64")
    .Output("save_id: string")
    .Output("items: string")
    .SetIsStateful()
    .SetShapeFn(DeltaStateShape)
    .Doc(R"doc(
Where a delta directory stands: the newest base (its id and serial), the last
sequence committed after it, that generation's save id and its item lines.
base_serial and sequence are -1, and items empty, when the directory holds no
base. A sequence missing between the base and the last one is an error.
)doc");

REGISTER_OP("DynembApplyDeltas")
    .Input("dirpath: string")
    .Input("base_id: string")
    .Input("base_serial: int64")
    .Input("sequence: int64")
    .Input("tables: num_tables * resource")
    .Input("dense: dense_dtypes")
    .Output("new_base_id: string")
    .Output("new_base_serial: int64")
    .Output("new_sequence: int64")
    .Output("applied: int64")
    .Output("dense_values: dense_dtypes")
    .Attr("num_tables: int >= 0")
    .Attr("table_identities: list(string) = []")
    .Attr("table_shards: list(int) = []")
    .Attr("dense_identities: list(string) = []")
    .Attr("dense_dtypes: list({float, double, half, bfloat16, int8, int32, int64, bool}) >= 0")
    .Attr("max_generations: int >= 0 = 0")
    .SetIsStateful()
    .SetShapeFn(ApplyDeltasShape)
    .Doc(R"doc(
Applies, in order, the committed generations of `dirpath` that come after the
state (base_id, base_serial, sequence), and returns the new state and how many
it applied. A state of sequence -1 (nothing applied), or of an older base,
starts from the directory's newest base. A sequence missing before the last
one, a delta of another base, or a directory behind the state is an error.
Each generation's files are all checked (sizes, checksums, digests, dtypes)
before any table changes; then each table item is applied: `replace` loads
the files into a new table aside that takes the old one's place (in place for
tables that cannot be staged), `delta` removes the removed keys then upserts
the rows, each row under its shard's lock (a lookup sees it before or after).
Items are matched by identity (table_identities: one per item of
table_shards[i] consecutive tables; dense_identities: one per dense input);
items of the model that no generation names are left alone.
dense: the dense variables' current values; dense_values: their values after
the last generation applied (the inputs when none applied).
max_generations: apply at most this many (0: all).
)doc");

}  // namespace dynemb
