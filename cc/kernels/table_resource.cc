#include "cc/kernels/table_resource.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.pb.h"

namespace dynemb {

bool ToCoreKeyType(tensorflow::DataType dtype, KeyType* out) {
  switch (dtype) {
    case tensorflow::DT_INT32: *out = KeyType::kInt32; return true;
    case tensorflow::DT_INT64: *out = KeyType::kInt64; return true;
    case tensorflow::DT_STRING: *out = KeyType::kString; return true;
    default: return false;
  }
}

bool ToCoreValueType(tensorflow::DataType dtype, ValueType* out) {
  switch (dtype) {
    case tensorflow::DT_FLOAT: *out = ValueType::kFloat32; return true;
    case tensorflow::DT_DOUBLE: *out = ValueType::kFloat64; return true;
    case tensorflow::DT_HALF: *out = ValueType::kFloat16; return true;
    case tensorflow::DT_BFLOAT16: *out = ValueType::kBFloat16; return true;
    case tensorflow::DT_INT8: *out = ValueType::kInt8; return true;
    case tensorflow::DT_INT32: *out = ValueType::kInt32; return true;
    case tensorflow::DT_INT64: *out = ValueType::kInt64; return true;
    case tensorflow::DT_BOOL: *out = ValueType::kBool; return true;
    default: return false;
  }
}

absl::Status ScalarString(const tensorflow::Tensor& t, const char* what, std::string* out) {
  if (t.dtype() != tensorflow::DT_STRING || !tensorflow::TensorShapeUtils::IsScalar(t.shape())) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be a scalar string, got ",
                                                   tensorflow::DataTypeString(t.dtype()), " ",
                                                   t.shape().DebugString()));
  }
  *out = std::string(t.scalar<tensorflow::tstring>()());
  return absl::OkStatus();
}

tensorflow::TensorShape KeyedShape(const tensorflow::TensorShape& keys,
                                   const tensorflow::TensorShape& value_shape) {
  tensorflow::TensorShape out = keys;
  out.AppendShape(value_shape);
  return out;
}

absl::Status ToTfStatus(const Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.code()), status.message());
}

Status FromTfStatus(const absl::Status& status) {
  if (status.ok()) return Status::Ok();
  return Status(static_cast<StatusCode>(status.code()), std::string(status.message()));
}

ThreadPoolRunner::ThreadPoolRunner(tensorflow::OpKernelContext* ctx)
    : pool_(ctx->device()->tensorflow_cpu_worker_threads()->workers) {}

void ThreadPoolRunner::ParallelFor(int64_t n, int64_t cost_per_unit,
                                   const std::function<void(int64_t, int64_t)>& fn) const {
  pool_->ParallelFor(n, cost_per_unit, fn);
}

int ThreadPoolRunner::Parallelism() const { return pool_->NumThreads(); }

Status TableResource::LoadFiles(const std::vector<ByteSource*>& sources,
                                const LoadOptions& options, const Runner& runner) {
  return LoadTable(sources, table(), options, runner);
}

absl::Status TableResource::NewStagingTable(int64_t, std::unique_ptr<Table>* out) {
  out->reset();
  return absl::UnimplementedError("this device's tables load in place");
}

void TableResource::ReplaceTable(std::unique_ptr<Table> table) {
  std::unique_ptr<Table> old;
  {
    absl::MutexLock lock(&use_mu_);
    Table* const incoming = table.get();
    old = SwapOwnedTable(std::move(table));
    table_ = incoming;
  }
  // `old` (the replaced table) is freed here, outside the lock: freeing a
  // big table takes a while, and ops may use the new one meanwhile.
}

absl::Status CpuTableResource::NewStagingTable(int64_t rows, std::unique_ptr<Table>* out) {
  if (!staged_loads_) return TableResource::NewStagingTable(rows, out);
  TableOptions staged = options();
  // Presized for the rows coming, so the load never grows a slot array.
  staged.init_capacity = std::max<int64_t>(staged.init_capacity, rows);
  if (staged.max_capacity > 0) staged.init_capacity = std::min(staged.init_capacity, staged.max_capacity);
  Status status;
  *out = NewCpuTable(staged, &status);
  if (*out == nullptr && status.code() == StatusCode::kInvalidArgument) {
    // Presizing asked too much memory at once: grow as the rows arrive.
    *out = NewCpuTable(options(), &status);
  }
  return ToTfStatus(status);
}

absl::Status CpuTableResource::NewRunner(tensorflow::OpKernelContext* ctx,
                                         std::unique_ptr<Runner>* runner) {
  *runner = std::make_unique<ThreadPoolRunner>(ctx);
  return absl::OkStatus();
}

std::string TableResource::DebugString() const {
  TableUse use(*this);
  const TableOptions& opt = options_;
  return absl::StrCat("DynembTable(key=", tensorflow::DataTypeString(key_dtype_),
                      ", value=", tensorflow::DataTypeString(value_dtype_),
                      ", value_shape=", value_shape_.DebugString(), ", size=", table_->Size(),
                      opt.max_capacity > 0 ? absl::StrCat(", max_capacity=", opt.max_capacity)
                                           : std::string(),
                      ")");
}

}  // namespace dynemb
