// Op registration of the streaming checkpoint writer and reader
// (cc/kernels/checkpoint_kernels.cc; used by tensorflow_dynemb/persistence/checkpoint.py).

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace dynemb {

REGISTER_OP("DynembSaveTablesToBundle")
    .Input("prefix: string")
    .Input("tables: N * resource")
    .Output("prefixes: num_files * string")
    .Attr("N: int >= 1")
    .Attr("tensor_names: list(string)")
    .Attr("entry_tables: list(int)")
    .Attr("num_files: int >= 1 = 1")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Writes the content of tables into TF checkpoint bundles (the files SaveV2
writes), streaming each table from a consistent snapshot in chunks instead of
copying it whole first. The tables form entries: `entry_tables[i]` tables in
input order (a de.Variable's shards), whose rows, concatenated, are entry i's
tensors `tensor_names[3i]` (keys [n]), `tensor_names[3i + 1]` (values
[n] + value_shape) and, unless empty, `tensor_names[3i + 2]` (scores [n],
int64). Each chunk is a slice of its full tensor; readers of the checkpoint
(RestoreV2) see whole tensors. The rows are cut into `num_files` bundles of
about equal size, written at once by as many threads; `prefixes` are their
prefixes (`{prefix}_{i}_of_{num_files}`), to merge with MergeV2Checkpoints.
Numeric keys only (TF reads no sliced strings).
Writers of the tables wait until the op is done.
)doc");

REGISTER_OP("DynembRestoreTablesFromBundle")
    .Input("prefix: string")
    .Input("tables: N * resource")
    .Attr("N: int >= 1")
    .Attr("tensor_names: list(string)")
    .Attr("entry_tables: list(int)")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::shape_inference::ShapeHandle unused;
      return c->WithRank(c->input(0), 0, &unused);
    })
    .Doc(R"doc(
Replaces the content of tables with tensors of the TF checkpoint at `prefix`,
reading them in chunks (the slices DynembSaveTablesToBundle wrote; a tensor
stored whole is read whole) straight into the tables instead of reading each
tensor whole first. Entries as in DynembSaveTablesToBundle: entry i's
`entry_tables[i]` tables take the rows of `tensor_names[3i]` (keys),
`tensor_names[3i + 1]` (values) and, unless empty, `tensor_names[3i + 2]`
(scores; empty: the tables score the keys as an insert does). An entry of
several tables (a de.Variable's shards) sends each key to table
ShardOfKey(key, entry_tables[i]), as de.default_partition_fn routes keys.
Every tensor's dtype and shape are checked before any table changes; when a
table holds entries, every chunk is also read (and its checksum checked)
before the tables are cleared, so a damaged checkpoint leaves them unchanged.
Numeric keys, CPU tables.
)doc");

}  // namespace dynemb
