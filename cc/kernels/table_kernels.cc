// The table ops' kernels (table_kernels.h), and their CPU registrations.

#include "cc/kernels/table_kernels.h"

#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/table.h"
#include "cc/kernels/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace dynemb {

using ::tensorflow::DataType;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

namespace {

tensorflow::AllocatorAttributes HostMemory() {
  tensorflow::AllocatorAttributes attr;
  attr.set_on_host(true);
  return attr;
}

}  // namespace

// ---------------------------------------------------------------------------
// Create
// ---------------------------------------------------------------------------
CreateTableOp::CreateTableOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
  OP_REQUIRES_OK(ctx, ctx->GetAttr("container", &container_));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("shared_name", &shared_name_));
  bool use_node_name_sharing = false;
  OP_REQUIRES_OK(ctx, ctx->GetAttr("use_node_name_sharing", &use_node_name_sharing));
  if (shared_name_.empty() && use_node_name_sharing) shared_name_ = name();
  OP_REQUIRES_OK(ctx, ctx->GetAttr("anonymous", &anonymous_));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("key_dtype", &key_dtype_));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("value_dtype", &value_dtype_));
  tensorflow::PartialTensorShape value_shape;
  OP_REQUIRES_OK(ctx, ctx->GetAttr("value_shape", &value_shape));
  OP_REQUIRES(ctx, value_shape.AsTensorShape(&value_shape_),
              absl::InvalidArgumentError(absl::StrCat(
                  "value_shape must be fully defined, got ", value_shape.DebugString())));
  OP_REQUIRES(ctx, ToCoreKeyType(key_dtype_, &options_.key_type),
              absl::InvalidArgumentError("unsupported key_dtype"));
  OP_REQUIRES(ctx, ToCoreValueType(value_dtype_, &options_.value_type),
              absl::InvalidArgumentError("unsupported value_dtype"));
  options_.dim = value_shape_.num_elements();
  OP_REQUIRES_OK(ctx, ctx->GetAttr("init_capacity", &options_.init_capacity));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("max_capacity", &options_.max_capacity));
  std::string strategy;
  OP_REQUIRES_OK(ctx, ctx->GetAttr("evict_strategy", &strategy));
  OP_REQUIRES(ctx, ParseEvictStrategy(strategy, &options_.strategy),
              absl::InvalidArgumentError(absl::StrCat("unknown evict_strategy '", strategy, "'")));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("step_per_epoch", &options_.step_per_epoch));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("find_updates_scores", &options_.find_updates_scores));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("max_hbm_for_values", &options_.max_hbm_for_values));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("track_changes", &options_.track_changes));
  OP_REQUIRES_OK(ctx, ToTfStatus(options_.Validate()));
}

void CreateTableOp::Compute(OpKernelContext* ctx) {
  const std::vector<tensorflow::DtypeAndPartialTensorShape> handle_data = {
      {key_dtype_, tensorflow::PartialTensorShape({})}, {value_dtype_, value_shape_}};
  Tensor* handle;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &handle, HostMemory()));
  if (anonymous_) {
    TableResource* resource;
    OP_REQUIRES_OK(ctx, NewResource(ctx, &resource));
    // The handle owns the only reference: the table lives as long as a
    // handle to it does.
    handle->scalar<tensorflow::ResourceHandle>()() =
        tensorflow::ResourceHandle::MakeRefCountingHandle(resource, ctx->device()->name(),
                                                          handle_data);
    return;
  }
  const std::string container =
      container_.empty() ? ctx->resource_manager()->default_container() : container_;
  const std::string shared_name =
      shared_name_.empty() ? absl::StrCat("dynemb_table_", reinterpret_cast<uintptr_t>(this))
                           : shared_name_;
  TableResource* resource;
  OP_REQUIRES_OK(ctx, ctx->resource_manager()->LookupOrCreate<TableResource>(
                          container, shared_name, &resource,
                          [this, ctx](TableResource** out) { return NewResource(ctx, out); }));
  tensorflow::core::ScopedUnref unref(resource);
  OP_REQUIRES(ctx,
              resource->key_dtype() == key_dtype_ && resource->value_dtype() == value_dtype_ &&
                  resource->value_shape() == value_shape_,
              absl::InvalidArgumentError(absl::StrCat(
                  "table '", shared_name, "' already exists as ", resource->DebugString(),
                  ", which does not match the requested key ",
                  tensorflow::DataTypeString(key_dtype_), ", value ",
                  tensorflow::DataTypeString(value_dtype_), ", value_shape ",
                  value_shape_.DebugString())));
  // What the table does, not how it was sized: init_capacity only presizes.
  const TableOptions& have = resource->options();
  OP_REQUIRES(ctx,
              have.max_capacity == options_.max_capacity && have.strategy == options_.strategy &&
                  have.step_per_epoch == options_.step_per_epoch &&
                  have.find_updates_scores == options_.find_updates_scores,
              absl::InvalidArgumentError(absl::StrCat(
                  "table '", shared_name, "' already exists with max_capacity ",
                  have.max_capacity, ", evict strategy ", EvictStrategyName(have.strategy),
                  ", step_per_epoch ", have.step_per_epoch, ", find_updates_scores ",
                  have.find_updates_scores, ", which does not match the requested "
                  "max_capacity ", options_.max_capacity, ", evict strategy ",
                  EvictStrategyName(options_.strategy), ", step_per_epoch ",
                  options_.step_per_epoch, ", find_updates_scores ",
                  options_.find_updates_scores)));
  handle->scalar<tensorflow::ResourceHandle>()() =
      tensorflow::MakeResourceHandle<TableResource>(ctx, container, shared_name, handle_data);
}

// ---------------------------------------------------------------------------
// Helpers shared by the table ops
// ---------------------------------------------------------------------------
namespace {

// A keys tensor as the core's batch representation. String keys become views
// of the tensor's strings, valid while the tensor lives. Check status() before
// use: the views of a large batch may not fit in memory, and a std::bad_alloc
// leaving an op's Compute would end the process.
class KeyBatch {
 public:
  explicit KeyBatch(const Tensor& keys) : n_(keys.NumElements()) {
    if (keys.dtype() != tensorflow::DT_STRING) {
      data_ = keys.data();
      return;
    }
    auto flat = keys.flat<tensorflow::tstring>();
    try {
      views_.reserve(n_);
    } catch (const std::bad_alloc&) {
      out_of_memory_ = true;
      return;
    }
    for (int64_t i = 0; i < n_; ++i) views_.emplace_back(flat(i).data(), flat(i).size());
    data_ = views_.data();
  }
  absl::Status status() const {
    if (!out_of_memory_) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(
        "out of memory for the views of ", n_, " string keys; free memory, or pass smaller batches"));
  }
  const void* data() const { return data_; }
  int64_t size() const { return n_; }

 private:
  int64_t n_;
  const void* data_ = nullptr;
  bool out_of_memory_ = false;
  std::vector<std::string_view> views_;
};

absl::Status CheckShape(const TensorShape& expected, const Tensor& actual, const char* what) {
  if (actual.shape() == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("Expected shape ", expected.DebugString(),
                                                 " for ", what, ", got ",
                                                 actual.shape().DebugString()));
}

// Scores input: keys.shape, or [0] for "assigned by the table" (nullptr).
absl::Status ScoresOrNull(const Tensor& scores, const Tensor& keys, const uint64_t** out) {
  *out = nullptr;
  if (scores.NumElements() == 0 && scores.dims() == 1 && keys.NumElements() != 0) {
    return absl::OkStatus();
  }
  if (scores.NumElements() == 0 && keys.NumElements() == 0) return absl::OkStatus();
  TF_RETURN_IF_ERROR(CheckShape(keys.shape(), scores, "scores"));
  // int64 scores carry the core's uint64 bits unchanged.
  *out = static_cast<const uint64_t*>(scores.data());
  return absl::OkStatus();
}

}  // namespace

TableOpKernel::TableOpKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
  const auto& attrs = ctx->def().attr();
  if (attrs.count("Tkey") > 0) OP_REQUIRES_OK(ctx, ctx->GetAttr("Tkey", &key_dtype_));
  if (attrs.count("Tvalue") > 0) OP_REQUIRES_OK(ctx, ctx->GetAttr("Tvalue", &value_dtype_));
}

void TableOpKernel::Compute(OpKernelContext* ctx) {
  tensorflow::core::RefCountPtr<TableResource> resource;
  OP_REQUIRES_OK(ctx,
                 tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, 0), &resource));
  if (key_dtype_ != tensorflow::DT_INVALID) {
    OP_REQUIRES(ctx, key_dtype_ == resource->key_dtype(),
                absl::InvalidArgumentError(absl::StrCat(
                    "keys must be ", tensorflow::DataTypeString(resource->key_dtype()),
                    " for this table, got ", tensorflow::DataTypeString(key_dtype_))));
  }
  if (value_dtype_ != tensorflow::DT_INVALID) {
    OP_REQUIRES(ctx, value_dtype_ == resource->value_dtype(),
                absl::InvalidArgumentError(absl::StrCat(
                    "values must be ", tensorflow::DataTypeString(resource->value_dtype()),
                    " for this table, got ", tensorflow::DataTypeString(value_dtype_))));
  }
  std::unique_ptr<Runner> runner;
  OP_REQUIRES_OK(ctx, resource->NewRunner(ctx, &runner));
  const TableResource::TableUse use(*resource);
  ComputeWithTable(ctx, resource.get(), *runner);
}

// ---------------------------------------------------------------------------
// Table ops
// ---------------------------------------------------------------------------
FindOp::FindOp(OpKernelConstruction* ctx) : TableOpKernel(ctx) {
  OP_REQUIRES_OK(ctx, ctx->GetAttr("update_scores", &update_scores_));
}

void FindOp::ComputeWithTable(OpKernelContext* ctx, TableResource* resource,
                              const Runner& runner) {
  const Tensor& keys = ctx->input(1);
  const Tensor& defaults = ctx->input(2);
  const TensorShape out_shape = KeyedShape(keys.shape(), resource->value_shape());
  const bool per_key = defaults.shape() == out_shape;
  OP_REQUIRES(ctx, per_key || defaults.shape() == resource->value_shape(),
              absl::InvalidArgumentError(absl::StrCat(
                  "Expected shape ", resource->value_shape().DebugString(), " or ",
                  out_shape.DebugString(), " for default_value, got ",
                  defaults.shape().DebugString())));
  Tensor* values;
  Tensor* exists;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &values));
  OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &exists));
  KeyBatch batch(keys);
  OP_REQUIRES_OK(ctx, batch.status());
  OP_REQUIRES_OK(ctx, ToTfStatus(resource->table().FindRows(
                          batch.data(), batch.size(), values->data(),
                          static_cast<bool*>(exists->data()), defaults.data(), per_key,
                          update_scores_, runner)));
}

namespace {

// Checks keys/values/scores of Insert and Import; returns the scores pointer.
absl::Status CheckInsertInputs(OpKernelContext* ctx, TableResource* resource,
                               const uint64_t** scores) {
  const Tensor& keys = ctx->input(1);
  TF_RETURN_IF_ERROR(
      CheckShape(KeyedShape(keys.shape(), resource->value_shape()), ctx->input(2), "values"));
  return ScoresOrNull(ctx->input(3), keys, scores);
}

// Checks keys/deltas/exists of Accum and AccumAndEvict.
absl::Status CheckAccumInputs(OpKernelContext* ctx, TableResource* resource) {
  const Tensor& keys = ctx->input(1);
  TF_RETURN_IF_ERROR(
      CheckShape(KeyedShape(keys.shape(), resource->value_shape()), ctx->input(2), "values"));
  return CheckShape(keys.shape(), ctx->input(3), "exists");
}

// The three outputs (keys, values, scores) of the *AndEvict ops. A batch of
// n rows evicts at most n entries: the core fills n-row buffers and the
// outputs are their first rows (slices share the buffer).
class EvictedOutputs {
 public:
  absl::Status Allocate(OpKernelContext* ctx, TableResource* resource, int64_t n) {
    TF_RETURN_IF_ERROR(ctx->allocate_temp(resource->key_dtype(), TensorShape({n}), &keys_));
    TF_RETURN_IF_ERROR(ctx->allocate_temp(
        resource->value_dtype(), KeyedShape(TensorShape({n}), resource->value_shape()),
        &values_));
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT64, TensorShape({n}), &scores_));
    if (keys_.dtype() == tensorflow::DT_STRING) {
      tensorflow::tstring* out = keys_.flat<tensorflow::tstring>().data();
      entries_.string_key = [out](int64_t i, std::string_view key) {
        out[i].assign(key.data(), key.size());
      };
    } else {
      entries_.keys = keys_.data();
    }
    entries_.values = values_.data();
    // int64 scores carry the core's uint64 bits unchanged.
    entries_.scores = static_cast<uint64_t*>(scores_.data());
    return absl::OkStatus();
  }

  EvictedEntries* entries() { return &entries_; }

  // Sets outputs 0-2 to the entries the core wrote.
  void SetOutputs(OpKernelContext* ctx) const {
    ctx->set_output(0, keys_.Slice(0, entries_.count));
    ctx->set_output(1, values_.Slice(0, entries_.count));
    ctx->set_output(2, scores_.Slice(0, entries_.count));
  }

 private:
  Tensor keys_, values_, scores_;
  EvictedEntries entries_;
};

}  // namespace

void InsertOp::ComputeWithTable(OpKernelContext* ctx, TableResource* resource,
                                const Runner& runner) {
  const uint64_t* scores;
  OP_REQUIRES_OK(ctx, CheckInsertInputs(ctx, resource, &scores));
  KeyBatch batch(ctx->input(1));
  OP_REQUIRES_OK(ctx, batch.status());
  OP_REQUIRES_OK(ctx, ToTfStatus(resource->table().Insert(batch.data(), batch.size(),
                                                          ctx->input(2).data(), scores, runner)));
}

void InsertAndEvictOp::ComputeWithTable(OpKernelContext* ctx, TableResource* resource,
                                        const Runner& runner) {
  const uint64_t* scores;
  OP_REQUIRES_OK(ctx, CheckInsertInputs(ctx, resource, &scores));
  KeyBatch batch(ctx->input(1));
  OP_REQUIRES_OK(ctx, batch.status());
  EvictedOutputs evicted;
  OP_REQUIRES_OK(ctx, evicted.Allocate(ctx, resource, batch.size()));
  OP_REQUIRES_OK(ctx, ToTfStatus(resource->table().InsertAndEvict(
                          batch.data(), batch.size(), ctx->input(2).data(), scores,
                          evicted.entries(), runner)));
  evicted.SetOutputs(ctx);
}

ImportOp::ImportOp(OpKernelConstruction* ctx) : TableOpKernel(ctx) {
  OP_REQUIRES_OK(ctx, ctx->GetAttr("restore", &restore_));
}

void ImportOp::ComputeWithTable(OpKernelContext* ctx, TableResource* resource,
                                const Runner& runner) {
  // Every input is checked before the content is dropped.
  const uint64_t* scores;
  OP_REQUIRES_OK(ctx, CheckInsertInputs(ctx, resource, &scores));
  if (restore_ && !resource->KeepsContentInCheckpoints()) return;
  KeyBatch batch(ctx->input(1));
  OP_REQUIRES_OK(ctx, batch.status());
  OP_REQUIRES_OK(ctx, ToTfStatus(resource->table().CheckedClear()));
  OP_REQUIRES_OK(ctx, ToTfStatus(resource->table().Insert(batch.data(), batch.size(),
                                                          ctx->input(2).data(), scores, runner)));
}

void AccumOp::ComputeWithTable(OpKernelContext* ctx, TableResource* resource,
                               const Runner& runner) {
  OP_REQUIRES_OK(ctx, CheckAccumInputs(ctx, resource));
  KeyBatch batch(ctx->input(1));
  OP_REQUIRES_OK(ctx, batch.status());
  OP_REQUIRES_OK(ctx, ToTfStatus(resource->table().Accum(
                          batch.data(), batch.size(), ctx->input(2).data(),
                          static_cast<const bool*>(ctx->input(3).data()), runner)));
}

void AccumAndEvictOp::ComputeWithTable(OpKernelContext* ctx, TableResource* resource,
                                       const Runner& runner) {
  OP_REQUIRES_OK(ctx, CheckAccumInputs(ctx, resource));
  KeyBatch batch(ctx->input(1));
  OP_REQUIRES_OK(ctx, batch.status());
  EvictedOutputs evicted;
  OP_REQUIRES_OK(ctx, evicted.Allocate(ctx, resource, batch.size()));
  OP_REQUIRES_OK(ctx, ToTfStatus(resource->table().AccumAndEvict(
                          batch.data(), batch.size(), ctx->input(2).data(),
                          static_cast<const bool*>(ctx->input(3).data()), evicted.entries(),
                          runner)));
  evicted.SetOutputs(ctx);
}

ApplyRuleOp::ApplyRuleOp(OpKernelConstruction* ctx) : TableOpKernel(ctx) {
  std::string rule;
  OP_REQUIRES_OK(ctx, ctx->GetAttr("rule", &rule));
  OP_REQUIRES(ctx, ParseUpdateRule(rule, &rule_),
              absl::InvalidArgumentError(absl::StrCat("unknown rule '", rule, "'")));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("weight_decay", &weight_decay_));
}

void ApplyRuleOp::ComputeWithTable(OpKernelContext* ctx, TableResource* resource,
                                   const Runner& runner) {
  const Tensor& keys = ctx->input(1);
  const Tensor& rows = ctx->input(2);
  const Tensor& grads = ctx->input(3);
  const Tensor& coefficients = ctx->input(5);
  OP_REQUIRES(ctx, keys.dims() == 1,
              absl::InvalidArgumentError(absl::StrCat("keys must be a vector, got shape ",
                                                      keys.shape().DebugString())));
  OP_REQUIRES(ctx, rows.dims() == 2 && rows.dim_size(0) == keys.dim_size(0),
              absl::InvalidArgumentError(absl::StrCat(
                  "Expected shape [", keys.dim_size(0), ", dim] for rows, got ",
                  rows.shape().DebugString())));
  OP_REQUIRES_OK(ctx, CheckShape(rows.shape(), grads, "grads"));
  OP_REQUIRES_OK(ctx, CheckShape(resource->value_shape(), ctx->input(4), "initial"));
  const int64_t num_coefficients = UpdateRuleCoefficients(rule_) + (weight_decay_ ? 2 : 0);
  OP_REQUIRES_OK(ctx, CheckShape(TensorShape({num_coefficients}), coefficients, "coefficients"));
  Tensor* new_rows;
  // Row i is read before it is written, so the rows' buffer can take the result.
  OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({2}, 0, rows.shape(), &new_rows));
  RuleStep step;
  step.rule = rule_;
  step.dim = rows.dim_size(1);
  step.weight_decay = weight_decay_;
  step.coefficients = coefficients.data();
  step.rows = rows.data();
  step.grads = grads.data();
  step.new_rows = new_rows->data();
  KeyBatch batch(keys);
  OP_REQUIRES_OK(ctx, batch.status());
  OP_REQUIRES_OK(ctx, ToTfStatus(resource->table().ApplyRule(
                          batch.data(), batch.size(), ctx->input(4).data(), step, runner)));
}

void RemoveOp::ComputeWithTable(OpKernelContext* ctx, TableResource* resource,
                                const Runner& runner) {
  KeyBatch batch(ctx->input(1));
  OP_REQUIRES_OK(ctx, batch.status());
  OP_REQUIRES_OK(ctx, ToTfStatus(resource->table().Remove(batch.data(), batch.size(), runner)));
}

void ClearOp::ComputeWithTable(OpKernelContext* ctx, TableResource* resource, const Runner&) {
  OP_REQUIRES_OK(ctx, ToTfStatus(resource->table().CheckedClear()));
}

// The scalar outputs of Size and Stats are in host memory on every device
// (HostMemory in the GPU registrations): the core keeps them on the host.
void SizeOp::ComputeWithTable(OpKernelContext* ctx, TableResource* resource, const Runner&) {
  Tensor* size;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &size));
  int64_t n = 0;
  OP_REQUIRES_OK(ctx, ToTfStatus(resource->table().CheckedSize(&n)));
  size->scalar<int64_t>()() = n;
}

void StatsOp::ComputeWithTable(OpKernelContext* ctx, TableResource* resource, const Runner&) {
  const Table& table = resource->table();
  int64_t size = 0;
  OP_REQUIRES_OK(ctx, ToTfStatus(table.CheckedSize(&size)));
  const int64_t capacity = table.Capacity();
  const TableCounters counters = table.Counters();
  const auto set = [ctx](int index, auto value) {
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(index, TensorShape({}), &out));
    out->scalar<decltype(value)>()() = value;
  };
  set(0, size);
  set(1, capacity);
  set(2, table.options().max_capacity);
  set(3, capacity > 0 ? static_cast<float>(size) / static_cast<float>(capacity) : 0.0f);
  set(4, static_cast<int64_t>(counters.inserts));
  set(5, static_cast<int64_t>(counters.lookups));
  set(6, static_cast<int64_t>(counters.misses));
  set(7, static_cast<int64_t>(counters.evictions));
}

namespace {

// Allocates the export outputs once the table knows its size. They are in
// the op's device memory (a GPU table fills them on the device).
class TensorExportSink : public ExportSink {
 public:
  TensorExportSink(OpKernelContext* ctx, const TensorShape& value_shape, bool with_scores)
      : ctx_(ctx), value_shape_(value_shape), with_scores_(with_scores) {}

  Status Allocate(int64_t n, void** keys, void** values, uint64_t** scores) override {
    Tensor* keys_t;
    Tensor* values_t;
    Tensor* scores_t;
    absl::Status s = ctx_->allocate_output(0, TensorShape({n}), &keys_t);
    if (s.ok()) s = ctx_->allocate_output(1, KeyedShape(TensorShape({n}), value_shape_), &values_t);
    if (s.ok()) s = ctx_->allocate_output(2, TensorShape({with_scores_ ? n : 0}), &scores_t);
    if (!s.ok()) return Status(StatusCode::kResourceExhausted, std::string(s.message()));
    if (keys_t->dtype() == tensorflow::DT_STRING) {
      string_keys_ = keys_t->flat<tensorflow::tstring>().data();
      *keys = nullptr;
    } else {
      *keys = keys_t->data();
    }
    *values = values_t->data();
    *scores = with_scores_ ? static_cast<uint64_t*>(scores_t->data()) : nullptr;
    return Status::Ok();
  }

  void SetStringKey(int64_t i, std::string_view key) override {
    string_keys_[i].assign(key.data(), key.size());
  }

 private:
  OpKernelContext* ctx_;
  TensorShape value_shape_;
  bool with_scores_;
  tensorflow::tstring* string_keys_ = nullptr;
};

}  // namespace

ExportOp::ExportOp(OpKernelConstruction* ctx) : TableOpKernel(ctx) {
  OP_REQUIRES_OK(ctx, ctx->GetAttr("with_scores", &with_scores_));
}

void ExportOp::ComputeWithTable(OpKernelContext* ctx, TableResource* resource,
                                const Runner& runner) {
  TensorExportSink sink(ctx, resource->value_shape(), with_scores_);
  OP_REQUIRES_OK(ctx, ToTfStatus(resource->table().Export(&sink, runner)));
}

// ---------------------------------------------------------------------------
// CPU registrations
// ---------------------------------------------------------------------------
namespace {

// Makes CPU tables.
class CpuCreateTableOp final : public CreateTableOp {
 public:
  using CreateTableOp::CreateTableOp;

 protected:
  absl::Status NewResource(OpKernelContext*, TableResource** out) const override {
    Status status;
    std::unique_ptr<Table> table = NewCpuTable(options(), &status);
    if (!status.ok()) return ToTfStatus(status);
    *out = new CpuTableResource(std::move(table), key_dtype(), value_dtype(), value_shape());
    return absl::OkStatus();
  }
};

#define DYNEMB_REGISTER_CPU(name, kernel) \
  REGISTER_KERNEL_BUILDER(Name(name).Device(tensorflow::DEVICE_CPU), kernel)

DYNEMB_REGISTER_CPU("DynembHashTable", CpuCreateTableOp);
DYNEMB_REGISTER_CPU("DynembTableFind", FindOp);
DYNEMB_REGISTER_CPU("DynembTableInsert", InsertOp);
DYNEMB_REGISTER_CPU("DynembTableInsertAndEvict", InsertAndEvictOp);
DYNEMB_REGISTER_CPU("DynembTableAccum", AccumOp);
DYNEMB_REGISTER_CPU("DynembTableAccumAndEvict", AccumAndEvictOp);
DYNEMB_REGISTER_CPU("DynembTableApplyRule", ApplyRuleOp);
DYNEMB_REGISTER_CPU("DynembTableRemove", RemoveOp);
DYNEMB_REGISTER_CPU("DynembTableClear", ClearOp);
DYNEMB_REGISTER_CPU("DynembTableSize", SizeOp);
DYNEMB_REGISTER_CPU("DynembTableStats", StatsOp);
DYNEMB_REGISTER_CPU("DynembTableExport", ExportOp);
DYNEMB_REGISTER_CPU("DynembTableImport", ImportOp);

#undef DYNEMB_REGISTER_CPU

}  // namespace
}  // namespace dynemb
