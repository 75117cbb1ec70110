// The kernels of the table ops (cc/ops/table_ops.cc), the same for every
// device: thin adapters that check shapes, turn tensors into spans and call
// the core table of a TableResource, with the Runner the resource gives
// (table_resource.h). table_kernels.cc defines them and registers them for
// the CPU; cc/kernels/gpu/ registers them for the GPU (CUDA builds only),
// with a CreateTableOp that makes GPU tables.

#ifndef DYNEMB_KERNELS_TABLE_KERNELS_H_
#define DYNEMB_KERNELS_TABLE_KERNELS_H_

#include <string>

#include "cc/core/table.h"
#include "cc/core/update_rules.h"
#include "cc/kernels/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace dynemb {

// DynembHashTable: makes (or finds, by shared name) a table resource and
// outputs its handle. A subclass per device makes the resource.
class CreateTableOp : public tensorflow::OpKernel {
 public:
  explicit CreateTableOp(tensorflow::OpKernelConstruction* ctx);
  void Compute(tensorflow::OpKernelContext* ctx) override;

 protected:
  // A new resource holding an empty table of options() on ctx's device.
  virtual absl::Status NewResource(tensorflow::OpKernelContext* ctx,
                                   TableResource** out) const = 0;

  const TableOptions& options() const { return options_; }
  tensorflow::DataType key_dtype() const { return key_dtype_; }
  tensorflow::DataType value_dtype() const { return value_dtype_; }
  const tensorflow::TensorShape& value_shape() const { return value_shape_; }

 private:
  std::string container_;
  std::string shared_name_;
  bool anonymous_ = false;
  tensorflow::DataType key_dtype_;
  tensorflow::DataType value_dtype_;
  tensorflow::TensorShape value_shape_;
  TableOptions options_;
};

// Base of every op that takes a table handle as input 0: looks the resource
// up, checks the op's key/value dtypes against the table, gets the resource's
// Runner, then calls ComputeWithTable.
class TableOpKernel : public tensorflow::OpKernel {
 public:
  explicit TableOpKernel(tensorflow::OpKernelConstruction* ctx);
  void Compute(tensorflow::OpKernelContext* ctx) override;

 protected:
  virtual void ComputeWithTable(tensorflow::OpKernelContext* ctx, TableResource* resource,
                                const Runner& runner) = 0;

 private:
  tensorflow::DataType key_dtype_ = tensorflow::DT_INVALID;
  tensorflow::DataType value_dtype_ = tensorflow::DT_INVALID;
};

// The ops that need nothing but their inputs.
#define DYNEMB_TABLE_KERNEL(Name)                                                    \
  class Name final : public TableOpKernel {                                          \
   public:                                                                           \
    using TableOpKernel::TableOpKernel;                                              \
                                                                                     \
   protected:                                                                        \
    void ComputeWithTable(tensorflow::OpKernelContext* ctx, TableResource* resource, \
                          const Runner& runner) override;                            \
  }

DYNEMB_TABLE_KERNEL(InsertOp);
DYNEMB_TABLE_KERNEL(InsertAndEvictOp);
// Replaces the content; as a restore (attr `restore`), leaves a table whose
// content checkpoints do not keep (TableResource::KeepsContentInCheckpoints)
// as it is.
class ImportOp final : public TableOpKernel {
 public:
  explicit ImportOp(tensorflow::OpKernelConstruction* ctx);

 protected:
  void ComputeWithTable(tensorflow::OpKernelContext* ctx, TableResource* resource,
                        const Runner& runner) override;

 private:
  bool restore_ = false;
};
DYNEMB_TABLE_KERNEL(AccumOp);
DYNEMB_TABLE_KERNEL(AccumAndEvictOp);
DYNEMB_TABLE_KERNEL(RemoveOp);
DYNEMB_TABLE_KERNEL(ClearOp);
DYNEMB_TABLE_KERNEL(SizeOp);
DYNEMB_TABLE_KERNEL(StatsOp);

#undef DYNEMB_TABLE_KERNEL

// Looks keys up; `update_scores` false (a read-only lookup) leaves scores alone.
class FindOp final : public TableOpKernel {
 public:
  explicit FindOp(tensorflow::OpKernelConstruction* ctx);

 protected:
  void ComputeWithTable(tensorflow::OpKernelContext* ctx, TableResource* resource,
                        const Runner& runner) override;

 private:
  bool update_scores_ = true;
};

// One optimizer step on a slot-state table (Table::ApplyRule). Registered on
// the GPU too (the GPU table's ApplyRule equals the CPU's bit for bit), but
// the Python layer asks only CPU tables until it has run under TF on a GPU
// (variable/training_state.py, docs/gpu.md).
class ApplyRuleOp final : public TableOpKernel {
 public:
  explicit ApplyRuleOp(tensorflow::OpKernelConstruction* ctx);

 protected:
  void ComputeWithTable(tensorflow::OpKernelContext* ctx, TableResource* resource,
                        const Runner& runner) override;

 private:
  UpdateRule rule_ = UpdateRule::kKerasAdam;
  bool weight_decay_ = false;
};

// Every entry of the table; the scores output is empty unless `with_scores`.
class ExportOp final : public TableOpKernel {
 public:
  explicit ExportOp(tensorflow::OpKernelConstruction* ctx);

 protected:
  void ComputeWithTable(tensorflow::OpKernelContext* ctx, TableResource* resource,
                        const Runner& runner) override;

 private:
  bool with_scores_ = true;
};

}  // namespace dynemb

#endif  // DYNEMB_KERNELS_TABLE_KERNELS_H_
