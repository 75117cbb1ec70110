// Op registrations of the table file ops (cc/kernels/file_kernels.h):
// streaming a table to and from files, and the generations that make the
// files of one save of a variable one whole (cc/core/generation.h).
//
// A save: DynembNewSaveId, one DynembTableSaveToFile per shard, then
// DynembWriteManifest, which commits them. A load: one DynembTableStageLoad
// per shard (every check; the rows loaded into a table aside), then, once
// every shard staged without error, one DynembTableCommitLoad per shard.

#include "cc/ops/shape_fns.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace dynemb {
namespace {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

absl::Status SaveToFileShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(Scalars(c, 0, 3));
  c->set_output(0, c->Scalar());
  return absl::OkStatus();
}

absl::Status WriteManifestShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(Scalars(c, 0, 2));
  ShapeHandle entries;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &entries));
  c->set_output(0, c->Scalar());
  return absl::OkStatus();
}

absl::Status StageLoadShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(Scalars(c, 0, 0));
  ShapeHandle paths;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &paths));
  TF_RETURN_IF_ERROR(c->WithRankAtMost(c->input(2), 1, &paths));
  TF_RETURN_IF_ERROR(Scalars(c, 3, 3));
  c->set_output(0, c->Scalar());
  c->set_output(1, c->Vector(c->UnknownDim()));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("DynembNewSaveId")
    .Output("save_id: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
A new save id (16 lowercase hex characters), different on every run: what
the files of one save carry.
)doc");

REGISTER_OP("DynembTableSaveToFile")
    .Input("table_handle: resource")
    .Input("dirpath: string")
    .Input("file_name: string")
    .Input("save_id: string")
    .Output("file_entry: string")
    .Attr("chunk_rows: int >= 1 = 65536")
    .Attr("shard_index: int >= 0 = 0")
    .Attr("num_shards: int >= 1 = 1")
    .Attr("routed: bool = false")
    .Attr("generation: bool = false")
    .Attr("sync: bool = true")
    .SetIsStateful()
    .SetShapeFn(SaveToFileShape)
    .Doc(R"doc(
Streams the table to one file (table file format 2, cc/core/table_io.h) in
chunks of `chunk_rows` entries, holding no second copy of the table, and
syncs it. With `generation`, the file is `dirpath/<file_name>.<save_id>.dynemb`,
a data file of a generation that DynembWriteManifest commits; otherwise it is
`dirpath/file_name` on its own, written aside and renamed into place.
`file_entry` is the file's manifest line: "shard name bytes rows digest".
`routed`: the table holds shard `shard_index` of `num_shards` as
DynembPartition routes keys. `sync` false: written through the page cache and
not synced (a killed process still leaves whole files; a machine that stops
may not).
)doc");

REGISTER_OP("DynembWriteManifest")
    .Input("dirpath: string")
    .Input("prefix: string")
    .Input("save_id: string")
    .Input("file_entries: string")
    .Output("committed_save_id: string")
    .Attr("key_dtype: {int32, int64, string}")
    .Attr("value_dtype: {float, double, half, bfloat16, int8, int32, int64, bool}")
    .Attr("dim: int >= 1")
    .Attr("partitioner: {'default', 'custom'} = 'default'")
    .Attr("sync: bool = true")
    .SetIsStateful()
    .SetShapeFn(WriteManifestShape)
    .Doc(R"doc(
Commits a generation: writes `dirpath/<prefix>.dynemb-manifest` naming the
files of `file_entries` (DynembTableSaveToFile's outputs, one per shard),
aside, synced, renamed into place; then deletes the files of the generation
it replaced and what killed saves of `prefix` left.
)doc");

REGISTER_OP("DynembTableStageLoad")
    .Input("table_handle: resource")
    .Input("manifest_paths: string")
    .Input("filepaths: string")
    .Input("expected_save_id: string")
    .Output("staged: resource")
    .Output("save_ids: string")
    .Attr("chunk_rows: int >= 1 = 65536")
    .Attr("num_shards: int >= 1 = 1")
    .Attr("shard_index: int >= 0 = 0")
    .Attr("partitioner: {'default', 'custom'} = 'default'")
    .Attr("clear_first: bool = true")
    .Attr("in_place: bool = false")
    .Attr("files_are_fallback: bool = false")
    .SetIsStateful()
    .SetShapeFn(StageLoadShape)
    .Doc(R"doc(
The first half of a load into the table (shard `shard_index` of `num_shards`,
its keys routed by `partitioner`): reads every generation whose manifest is
in `manifest_paths` and every file of `filepaths` (standalone or version 1
files; with `files_are_fallback`, only when no manifest exists), checks all
of it (checksums, save ids, shards, dtypes, dim, each key's shard), and loads
it into a new table aside (`staged`), leaving the table as it is. With
`in_place`, without `clear_first`, or on a device whose tables are not
staged, the files are only checked here and read again by the commit.
`expected_save_id` (or "") is the save every generation must be.
`save_ids`: the save id of each generation or file read ("" for version 1).
)doc");

REGISTER_OP("DynembTableCommitLoad")
    .Input("table_handle: resource")
    .Input("staged: resource")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return Scalars(c, 0, 1); })
    .Doc(R"doc(
The second half of a load: the staged table becomes the table's content
(the old content is freed); cannot fail. A load staged in place replaces or
upserts the content from the files now.
)doc");

}  // namespace dynemb
