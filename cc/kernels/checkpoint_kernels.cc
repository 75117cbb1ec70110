// DynembSaveTablesToBundle (cc/ops/checkpoint_ops.cc): streams tables into
// TF checkpoint bundle files, the way tensorflow_dynemb/checkpoint.py saves
// tables and variables for tf.train.Checkpoint.
//
// Why not export + SaveV2: SaveV2 wants each tensor whole, so a save first
// copied every table into fresh tensors (for 10M keys of an Adam state,
// 2.2 GB of new memory, faulted in page by page) and then wrote them on one
// thread. Here each table is read from a snapshot (Table::Snapshot: the
// table's reader locks, so every row comes from one state) in chunks of a
// few MiB, and each chunk is written as a slice of the entry's full tensor:
// memory stays O(chunk) and several files are written at once. TF's readers
// (RestoreV2, tf.train.load_checkpoint) assemble the slices, so the
// checkpoint holds the same tensors, under the same names, as the export
// path writes.

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/table.h"
#include "cc/kernels/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/tensor_slice.h"
#include "tensorflow/core/util/tensor_bundle/tensor_bundle.h"

namespace dynemb {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::TensorSlice;

// A chunk's values: a few MiB, so a thread's buffers stay in the cache and
// a 10M-key table is ~100 slices per tensor.
constexpr int64_t kChunkBytes = 8 << 20;

// One checkpointed object: the snapshots of its tables (a de.Variable's
// shards, in order) and the names of its tensors.
struct Entry {
  std::string keys_name, values_name, scores_name;  // scores_name empty: not saved
  std::vector<std::unique_ptr<TableSnapshot>> snapshots;
  std::vector<int64_t> offsets;  // first row of each snapshot in the entry; back() = rows
  tensorflow::DataType key_dtype, value_dtype;
  TensorShape value_shape;
  int64_t rows() const { return offsets.back(); }
};

// A range of one snapshot's rows, and where they go in its entry's tensors.
struct Piece {
  const Entry* entry;
  const TableSnapshot* snapshot;
  int64_t begin, end;  // in the snapshot
  int64_t at;          // the entry's row of `begin`
};

TensorSlice Rows(int dims, int64_t start, int64_t length) {
  TensorSlice slice(dims);
  slice.set_start(0, start);
  slice.set_length(0, length);
  return slice;
}

// Writes `pieces` into one bundle at `prefix`, plus, whole, the tensors of
// `empty` entries (a slice cannot have zero rows).
absl::Status WriteBundle(const std::string& prefix, const std::vector<Piece>& pieces,
                         const std::vector<const Entry*>& empty) {
  tensorflow::BundleWriter writer(tensorflow::Env::Default(), prefix);
  for (const Entry* e : empty) {
    TF_RETURN_IF_ERROR(writer.Add(e->keys_name, Tensor(e->key_dtype, TensorShape({0}))));
    const TensorShape no_values = KeyedShape(TensorShape({0}), e->value_shape);
    TF_RETURN_IF_ERROR(writer.Add(e->values_name, Tensor(e->value_dtype, no_values)));
    if (!e->scores_name.empty()) {
      const Tensor no_scores(tensorflow::DT_INT64, TensorShape({0}));
      TF_RETURN_IF_ERROR(writer.Add(e->scores_name, no_scores));
    }
  }
  for (const Piece& p : pieces) {
    const Entry& e = *p.entry;
    const int64_t value_bytes =
        e.value_shape.num_elements() * tensorflow::DataTypeSize(e.value_dtype);
    const int64_t key_bytes = tensorflow::DataTypeSize(e.key_dtype);
    const int64_t chunk_rows =
        std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(1, value_bytes));
    const int64_t cap = std::min(chunk_rows, p.end - p.begin);
    Tensor keys(e.key_dtype, TensorShape({cap}));
    Tensor values(e.value_dtype, KeyedShape(TensorShape({cap}), e.value_shape));
    Tensor scores(tensorflow::DT_INT64, TensorShape({e.scores_name.empty() ? 0 : cap}));
    const TensorShape full_keys({e.rows()});
    const TensorShape full_values = KeyedShape(full_keys, e.value_shape);
    const int value_dims = full_values.dims();
    int64_t at = p.at;
    absl::Status written;
    Status read = p.snapshot->Read(
        p.begin, p.end, chunk_rows,
        [&](const void* k, int64_t m, const void* v, const uint64_t* s) -> Status {
          // Slice(0, m) shares the buffer: the last chunk is usually short.
          Tensor chunk_keys = keys.Slice(0, m), chunk_values = values.Slice(0, m);
          std::memcpy(chunk_keys.data(), k, m * key_bytes);
          std::memcpy(chunk_values.data(), v, m * value_bytes);
          written = writer.AddSlice(e.keys_name, full_keys, Rows(1, at, m), chunk_keys);
          if (written.ok()) {
            written = writer.AddSlice(e.values_name, full_values, Rows(value_dims, at, m),
                                      chunk_values);
          }
          if (written.ok() && !e.scores_name.empty()) {
            Tensor chunk_scores = scores.Slice(0, m);
            std::memcpy(chunk_scores.data(), s, m * sizeof(uint64_t));
            written = writer.AddSlice(e.scores_name, full_keys, Rows(1, at, m), chunk_scores);
          }
          at += m;
          return FromTfStatus(written);
        });
    TF_RETURN_IF_ERROR(written);
    TF_RETURN_IF_ERROR(ToTfStatus(read));
  }
  return writer.Finish();
}

class SaveTablesToBundleOp : public OpKernel {
 public:
  explicit SaveTablesToBundleOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("tensor_names", &tensor_names_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("entry_tables", &entry_tables_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_files", &num_files_));
    int n = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("N", &n));
    int64_t total = 0;
    for (int64_t t : entry_tables_) {
      OP_REQUIRES(ctx, t >= 1,
                  absl::InvalidArgumentError(absl::StrCat(
                      "entry_tables must hold counts >= 1, got ", t)));
      total += t;
    }
    OP_REQUIRES(ctx, total == n,
                absl::InvalidArgumentError(absl::StrCat(
                    "entry_tables must add up to the ", n, " tables, got ", total)));
    OP_REQUIRES(ctx, tensor_names_.size() == 3 * entry_tables_.size(),
                absl::InvalidArgumentError(absl::StrCat(
                    "tensor_names must hold 3 names per entry (", 3 * entry_tables_.size(),
                    "), got ", tensor_names_.size())));
  }

  void Compute(OpKernelContext* ctx) override {
    const std::string prefix(ctx->input(0).scalar<tensorflow::tstring>()());
    // The resources stay referenced until the snapshots are gone.
    std::vector<tensorflow::core::RefCountPtr<TableResource>> resources;
    std::vector<Entry> entries(entry_tables_.size());
    int input = 1;
    for (size_t i = 0; i < entries.size(); ++i) {
      Entry& e = entries[i];
      e.keys_name = tensor_names_[3 * i];
      e.values_name = tensor_names_[3 * i + 1];
      e.scores_name = tensor_names_[3 * i + 2];
      e.offsets.push_back(0);
      for (int64_t t = 0; t < entry_tables_[i]; ++t, ++input) {
        tensorflow::core::RefCountPtr<TableResource> resource;
        OP_REQUIRES_OK(ctx, tensorflow::LookupResource(
                                ctx, tensorflow::HandleFromInput(ctx, input), &resource));
        OP_REQUIRES(ctx, resource->key_dtype() != tensorflow::DT_STRING,
                    absl::InvalidArgumentError(absl::StrCat(
                        "table ", input - 1, " (", e.keys_name, ") has string keys, which TF "
                        "cannot read back from slices; save it through its export")));
        if (t == 0) {
          e.key_dtype = resource->key_dtype();
          e.value_dtype = resource->value_dtype();
          e.value_shape = resource->value_shape();
        }
        OP_REQUIRES(ctx, resource->key_dtype() == e.key_dtype &&
                             resource->value_dtype() == e.value_dtype &&
                             resource->value_shape() == e.value_shape,
                    absl::InvalidArgumentError(absl::StrCat(
                        "the tables of ", e.keys_name, " differ in key dtype, value dtype or ",
                        "value shape (table ", input - 1, ")")));
        std::unique_ptr<TableSnapshot> snapshot;
        OP_REQUIRES_OK(ctx, ToTfStatus(resource->table().Snapshot(&snapshot)));
        e.offsets.push_back(e.offsets.back() + snapshot->size());
        e.snapshots.push_back(std::move(snapshot));
        resources.push_back(std::move(resource));
      }
    }

    // Every row of every entry, in order, cut into one contiguous range per
    // file; entries without rows go whole into the first file.
    int64_t total_rows = 0;
    std::vector<const Entry*> empty;
    for (const Entry& e : entries) {
      total_rows += e.rows();
      if (e.rows() == 0) empty.push_back(&e);
    }
    const int64_t files = num_files_;
    std::vector<std::vector<Piece>> pieces(files);
    for (int64_t f = 0; f < files; ++f) {
      const int64_t lo = total_rows * f / files, hi = total_rows * (f + 1) / files;
      int64_t base = 0;  // the first global row of the entry
      for (const Entry& e : entries) {
        for (size_t s = 0; s < e.snapshots.size(); ++s) {
          const int64_t a = std::max(lo, base + e.offsets[s]);
          const int64_t b = std::min(hi, base + e.offsets[s + 1]);
          if (a < b) {
            pieces[f].push_back(Piece{&e, e.snapshots[s].get(), a - base - e.offsets[s],
                                      b - base - e.offsets[s], a - base});
          }
        }
        base += e.rows();
      }
    }

    std::vector<std::string> file_prefixes(files);
    for (int64_t f = 0; f < files; ++f) {
      file_prefixes[f] = absl::StrCat(prefix, "_", f, "_of_", files);
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(f, TensorShape({}), &out));
      out->scalar<tensorflow::tstring>()() = file_prefixes[f];
    }
    std::vector<absl::Status> status(files);
    const std::vector<const Entry*> none;
    const auto write = [&](int64_t f) {
      status[f] = WriteBundle(file_prefixes[f], pieces[f], f == 0 ? empty : none);
    };
    // Own threads, not the op's pool: they run while this op holds the tables'
    // locks, and a pool thread could be one that waits for those locks.
    std::vector<std::thread> writers;
    for (int64_t f = 1; f < files; ++f) writers.emplace_back(write, f);
    write(0);
    for (auto& w : writers) w.join();
    for (const absl::Status& s : status) OP_REQUIRES_OK(ctx, s);
  }

 private:
  std::vector<std::string> tensor_names_;
  std::vector<int64_t> entry_tables_;
  int64_t num_files_ = 1;
};

REGISTER_KERNEL_BUILDER(Name("DynembSaveTablesToBundle").Device(tensorflow::DEVICE_CPU),
                        SaveTablesToBundleOp);

}  // namespace
}  // namespace dynemb
