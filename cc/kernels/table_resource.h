// The TF resource that owns a core table, and the small adapters between TF
// types and the core's (dtypes, Status, thread pool).

#ifndef DYNEMB_KERNELS_TABLE_RESOURCE_H_
#define DYNEMB_KERNELS_TABLE_RESOURCE_H_

#include <memory>
#include <string>

#include "cc/core/table.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace dynemb {

// TF dtype <-> core type. Return false for dtypes the core does not support.
bool ToCoreKeyType(tensorflow::DataType dtype, KeyType* out);
bool ToCoreValueType(tensorflow::DataType dtype, ValueType* out);

// Core status -> TF status (the codes are the same numbers).
absl::Status ToTfStatus(const Status& status);

// Runs core batches on the op's intra-op thread pool.
class ThreadPoolRunner : public Runner {
 public:
  explicit ThreadPoolRunner(tensorflow::OpKernelContext* ctx);
  void ParallelFor(int64_t n, int64_t cost_per_unit,
                   const std::function<void(int64_t, int64_t)>& fn) const override;

 private:
  tensorflow::thread::ThreadPool* pool_;
};

// A table resource: the core table plus the TF-facing shape of its values.
// Thread-safe (the core table is).
class TableResource : public tensorflow::ResourceBase {
 public:
  TableResource(std::unique_ptr<Table> table, tensorflow::DataType key_dtype,
                tensorflow::DataType value_dtype, tensorflow::TensorShape value_shape)
      : table_(std::move(table)),
        key_dtype_(key_dtype),
        value_dtype_(value_dtype),
        value_shape_(std::move(value_shape)) {}

  Table& table() { return *table_; }
  tensorflow::DataType key_dtype() const { return key_dtype_; }
  tensorflow::DataType value_dtype() const { return value_dtype_; }
  const tensorflow::TensorShape& value_shape() const { return value_shape_; }

  std::string DebugString() const override;
  int64_t MemoryUsed() const override { return table_->MemoryBytes(); }

 private:
  std::unique_ptr<Table> table_;
  const tensorflow::DataType key_dtype_;
  const tensorflow::DataType value_dtype_;
  const tensorflow::TensorShape value_shape_;
};

}  // namespace dynemb

#endif  // DYNEMB_KERNELS_TABLE_RESOURCE_H_
