#include "cc/kernels/table_resource.h"

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

Status TableResource::LoadFiles(const std::vector<ByteSource*>& sources,
                                const LoadOptions& options, const Runner& runner) {
  return LoadTable(sources, table(), options, runner);
}

absl::Status CpuTableResource::NewRunner(tensorflow::OpKernelContext* ctx,
                                         std::unique_ptr<Runner>* runner) {
  *runner = std::make_unique<ThreadPoolRunner>(ctx);
  return absl::OkStatus();
}

std::string TableResource::DebugString() const {
  const TableOptions& opt = table_->options();
  return absl::StrCat("DynembTable(key=", tensorflow::DataTypeString(key_dtype_),
                      ", value=", tensorflow::DataTypeString(value_dtype_),
                      ", value_shape=", value_shape_.DebugString(), ", size=", table_->Size(),
                      opt.max_capacity > 0 ? absl::StrCat(", max_capacity=", opt.max_capacity)
                                           : std::string(),
                      ")");
}

}  // namespace dynemb
