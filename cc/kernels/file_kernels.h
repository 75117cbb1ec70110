// The kernels of the table file ops (cc/ops/file_ops.cc): a table streamed
// to and from files through TF's file systems (local, GCS, HDFS, ...), and
// the generations that make one save's files a whole (cc/core/generation.h).
//
// What a load guarantees (docs/tables.md, "Files"): DynembTableStageLoad
// makes every check that can fail on the files (the manifest, each file's
// size, save id, shard, checksums and digest, the dtypes and dim, each key's
// shard) before the table changes. Staged (a CPU table, the default), the
// rows go into a new table aside, which DynembTableCommitLoad puts in place
// of the old one (TableResource::ReplaceTable, which cannot fail): a load
// that fails at any point, memory running out included, leaves the table as
// it was. In place (`in_place`, an upsert, or a GPU table) the commit reads
// the checked files again into the table itself: only the storage failing
// under it or memory running out can then stop it, and the error says the
// table holds part of the rows.
//
// The CPU kernels are registered here; cc/kernels/gpu/ registers the same
// kernels for GPU tables (their paths and handles in host memory).

#ifndef DYNEMB_KERNELS_FILE_KERNELS_H_
#define DYNEMB_KERNELS_FILE_KERNELS_H_

#include "cc/kernels/table_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace dynemb {

// DynembTableSaveToFile: SaveTable into a file, synced.
class SaveToFileOp final : public TableOpKernel {
 public:
  explicit SaveToFileOp(tensorflow::OpKernelConstruction* ctx);

 protected:
  void ComputeWithTable(tensorflow::OpKernelContext* ctx, TableResource* resource,
                        const Runner& runner) override;

 private:
  SaveOptions options_;
  bool generation_ = false;
  bool sync_ = true;
};

// DynembTableStageLoad: every check, and the rows loaded aside (see above).
class StageLoadOp final : public tensorflow::OpKernel {
 public:
  explicit StageLoadOp(tensorflow::OpKernelConstruction* ctx);
  void Compute(tensorflow::OpKernelContext* ctx) override;

 private:
  int64_t chunk_rows_ = 65536;
  int32_t num_shards_ = 1;
  int32_t shard_index_ = 0;
  bool custom_partitioner_ = false;
  bool clear_first_ = true;
  bool in_place_ = false;
  bool files_are_fallback_ = false;
};

// DynembTableCommitLoad: the staged rows become the table's content.
class CommitLoadOp final : public tensorflow::OpKernel {
 public:
  using tensorflow::OpKernel::OpKernel;
  void Compute(tensorflow::OpKernelContext* ctx) override;
};

}  // namespace dynemb

#endif  // DYNEMB_KERNELS_FILE_KERNELS_H_
