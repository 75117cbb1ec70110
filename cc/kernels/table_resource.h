// The TF resource that owns a core table, and the small adapters between TF
// types and the core's (dtypes, Status, thread pool).
//
// Table memory belongs to the resource's device: a CpuTableResource holds a
// CPU table; a GPU table's resource (cc/kernels/gpu/, CUDA builds only) holds
// a table in GPU memory from TF's allocator, run on TF's stream.

#ifndef DYNEMB_KERNELS_TABLE_RESOURCE_H_
#define DYNEMB_KERNELS_TABLE_RESOURCE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "cc/core/table.h"
#include "cc/core/table_io.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace dynemb {

// TF dtype <-> core type. Return false for dtypes the core does not support.
bool ToCoreKeyType(tensorflow::DataType dtype, KeyType* out);
bool ToCoreValueType(tensorflow::DataType dtype, ValueType* out);

// Core status <-> TF status (the codes are the same numbers).
absl::Status ToTfStatus(const Status& status);
Status FromTfStatus(const absl::Status& status);

// The string in `t`, a scalar input named `what` (a scalar's accessor would
// end the process on any other shape).
absl::Status ScalarString(const tensorflow::Tensor& t, const char* what, std::string* out);

// The shape of the values of `keys`: keys' shape followed by the value shape.
tensorflow::TensorShape KeyedShape(const tensorflow::TensorShape& keys,
                                   const tensorflow::TensorShape& value_shape);

// Runs core batches on the op's intra-op thread pool.
class ThreadPoolRunner : public Runner {
 public:
  explicit ThreadPoolRunner(tensorflow::OpKernelContext* ctx);
  void ParallelFor(int64_t n, int64_t cost_per_unit,
                   const std::function<void(int64_t, int64_t)>& fn) const override;
  int Parallelism() const override;

 private:
  tensorflow::thread::ThreadPool* pool_;
};

// A table resource: a core table plus the TF-facing shape of its values. A
// subclass per device owns the table (and whatever the table's memory comes
// from) and says how an op runs batches on it; the kernels
// (table_kernels.h) are the same for every device. Thread-safe (the core
// table is).
//
// A load from files may replace the table itself (ReplaceTable: the new
// content was loaded into a staging table aside, so a failed load leaves
// the old one untouched). So every op holds a TableUse while it uses
// table(), and ReplaceTable waits until none does.
class TableResource : public tensorflow::ResourceBase {
 public:
  // `table` is owned by the subclass and lives as long as the resource (or
  // until ReplaceTable).
  TableResource(Table* table, tensorflow::DataType key_dtype, tensorflow::DataType value_dtype,
                tensorflow::TensorShape value_shape)
      : table_(table),
        options_(table->options()),
        key_dtype_(key_dtype),
        value_dtype_(value_dtype),
        value_shape_(std::move(value_shape)) {}

  // Held by an op for as long as it uses table() (a shared lock: ops do
  // not wait for each other, only ReplaceTable waits for them). An op holds
  // at most one per resource.
  class TableUse {
   public:
    explicit TableUse(const TableResource& resource) : lock_(&resource.use_mu_) {}

   private:
    absl::ReaderMutexLock lock_;
  };

  // The table; only while holding a TableUse of this resource.
  Table& table() { return *table_; }
  // The table's options, which every table the resource ever holds shares.
  const TableOptions& options() const { return options_; }
  tensorflow::DataType key_dtype() const { return key_dtype_; }
  tensorflow::DataType value_dtype() const { return value_dtype_; }
  const tensorflow::TensorShape& value_shape() const { return value_shape_; }

  // Whether checkpoint and SavedModel restores replace the content (attr
  // `restore` of DynembTableImport). False for a table whose content lives
  // elsewhere and is not the checkpoint's to restore: a Redis table whose
  // config says table_store_mode 2.
  virtual bool KeepsContentInCheckpoints() const { return true; }

  // The Runner for one op's batches on this table, valid while `ctx` is.
  virtual absl::Status NewRunner(tensorflow::OpKernelContext* ctx,
                                 std::unique_ptr<Runner>* runner) = 0;

  // Loads table files (table_io.h) into the table with `runner` (from
  // NewRunner). LoadTable hands the table host batches: a table in host
  // memory takes them as they are (this default).
  virtual Status LoadFiles(const std::vector<ByteSource*>& sources, const LoadOptions& options,
                           const Runner& runner);

  // A new empty table with this one's options, sized for about `rows` keys,
  // for a load to fill aside (a staged load). kUnimplemented where the
  // device's tables are not staged (this default): such loads replace the
  // content in place, after checking every file.
  virtual absl::Status NewStagingTable(int64_t rows, std::unique_ptr<Table>* out);

  // Makes `table` (from NewStagingTable, filled) the resource's table once no
  // op holds a TableUse, and destroys the old one. Cannot fail. Must not be
  // called while holding a TableUse of this resource.
  void ReplaceTable(std::unique_ptr<Table> table);

  std::string DebugString() const override;
  int64_t MemoryUsed() const override {
    TableUse use(*this);
    return table_->MemoryBytes();
  }

 protected:
  // Takes ownership of `table` and returns the table owned before (called
  // by ReplaceTable with every use excluded). Subclasses whose
  // NewStagingTable succeeds override it.
  virtual std::unique_ptr<Table> SwapOwnedTable(std::unique_ptr<Table> table) { return table; }

 private:
  mutable absl::Mutex use_mu_;
  Table* table_ ABSL_GUARDED_BY(use_mu_);
  const TableOptions options_;
  const tensorflow::DataType key_dtype_;
  const tensorflow::DataType value_dtype_;
  const tensorflow::TensorShape value_shape_;
};

// A table driven from the host (NewCpuTable, or a Redis table's client):
// batches run on the op's intra-op thread pool. With `staged_loads`, a load
// fills a new CPU table aside (NewStagingTable); without, it goes in place
// (a Redis table's buckets have no second copy to fill).
// `keeps_content_in_checkpoints`: see TableResource.
class CpuTableResource final : public TableResource {
 public:
  CpuTableResource(std::unique_ptr<Table> table, tensorflow::DataType key_dtype,
                   tensorflow::DataType value_dtype, tensorflow::TensorShape value_shape,
                   bool staged_loads = true, bool keeps_content_in_checkpoints = true)
      : TableResource(table.get(), key_dtype, value_dtype, std::move(value_shape)),
        table_(std::move(table)),
        staged_loads_(staged_loads),
        keeps_content_in_checkpoints_(keeps_content_in_checkpoints) {}

  bool KeepsContentInCheckpoints() const override { return keeps_content_in_checkpoints_; }
  absl::Status NewRunner(tensorflow::OpKernelContext* ctx,
                         std::unique_ptr<Runner>* runner) override;
  absl::Status NewStagingTable(int64_t rows, std::unique_ptr<Table>* out) override;

 protected:
  std::unique_ptr<Table> SwapOwnedTable(std::unique_ptr<Table> table) override {
    table_.swap(table);
    return table;
  }

 private:
  std::unique_ptr<Table> table_;
  const bool staged_loads_;
  const bool keeps_content_in_checkpoints_;
};

}  // namespace dynemb

#endif  // DYNEMB_KERNELS_TABLE_RESOURCE_H_
