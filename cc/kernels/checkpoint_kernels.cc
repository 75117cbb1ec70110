// DynembSaveTablesToBundle (cc/ops/checkpoint_ops.cc): streams tables into
// TF checkpoint bundle files, the way tensorflow_dynemb/persistence/checkpoint.py saves
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
//
// DynembRestoreTablesFromBundle reads those slices back straight into the
// tables, a few chunks at a time, instead of RestoreV2 assembling each whole
// tensor first (as much new memory again as the tables themselves).

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/partition.h"
#include "cc/core/table.h"
#include "cc/kernels/bundle_slices.h"
#include "cc/kernels/direct_io.h"
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

// The TableUses of an op's resources, one per distinct resource (a table
// may appear twice in an op's inputs; its lock is taken once).
class TableUses {
 public:
  void Add(const TableResource& resource) {
    for (const auto& use : uses_) {
      if (use.first == &resource) return;
    }
    uses_.emplace_back(&resource, std::make_unique<TableResource::TableUse>(resource));
  }

 private:
  std::vector<std::pair<const TableResource*, std::unique_ptr<TableResource::TableUse>>> uses_;
};

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

// Bytes of one row of values of `value_shape`.
int64_t ValueBytes(tensorflow::DataType value_dtype, const TensorShape& value_shape) {
  return value_shape.num_elements() * tensorflow::DataTypeSize(value_dtype);
}

// Bytes one row of an entry takes in the files: key, values and score.
int64_t FileBytesPerRow(tensorflow::DataType key_dtype, tensorflow::DataType value_dtype,
                        const TensorShape& value_shape, bool with_scores) {
  return tensorflow::DataTypeSize(key_dtype) + ValueBytes(value_dtype, value_shape) +
         (with_scores ? static_cast<int64_t>(sizeof(int64_t)) : 0);
}

TensorSlice Rows(int dims, int64_t start, int64_t length) {
  TensorSlice slice(dims);
  slice.set_start(0, start);
  slice.set_length(0, length);
  return slice;
}

// Reads the attrs both ops share: entry_tables counts tables per entry (each
// >= 1, adding up to the N table inputs), tensor_names holds 3 per entry.
absl::Status GetEntryAttrs(OpKernelConstruction* ctx, std::vector<std::string>* tensor_names,
                           std::vector<int64_t>* entry_tables) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("tensor_names", tensor_names));
  TF_RETURN_IF_ERROR(ctx->GetAttr("entry_tables", entry_tables));
  int num_tables = 0;
  TF_RETURN_IF_ERROR(ctx->GetAttr("N", &num_tables));
  int64_t total = 0;
  for (int64_t t : *entry_tables) {
    if (t < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("entry_tables must hold counts >= 1, got ", t));
    }
    total += t;
  }
  if (total != num_tables) {
    return absl::InvalidArgumentError(absl::StrCat("entry_tables must add up to the ",
                                                   num_tables, " tables, got ", total));
  }
  if (tensor_names->size() != 3 * entry_tables->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor_names must hold 3 names per entry (", 3 * entry_tables->size(),
                     "), got ", tensor_names->size()));
  }
  for (size_t i = 0; i < tensor_names->size(); ++i) {
    // Only the scores may be left out; "" is the bundle's own header key.
    if ((*tensor_names)[i].empty() && i % 3 != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor_names[", i, "] (the ", i % 3 == 0 ? "keys" : "values", " of entry ", i / 3,
          ") must not be empty"));
    }
  }
  return absl::OkStatus();
}

// Table `index` (input order) of the entry named `keys_name` must have
// numeric keys (TF reads no sliced strings) and the key dtype, value dtype
// and value shape of the entry's first table.
absl::Status CheckSameTables(const TableResource& first, const TableResource& table, int index,
                             const std::string& keys_name) {
  if (table.key_dtype() == tensorflow::DT_STRING) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", index, " (", keys_name, ") has string keys, which TF cannot read back from ",
        "slices; checkpoint it through its export"));
  }
  if (table.key_dtype() != first.key_dtype() || table.value_dtype() != first.value_dtype() ||
      table.value_shape() != first.value_shape()) {
    return absl::InvalidArgumentError(absl::StrCat("the tables of ", keys_name,
                                                   " differ in key dtype, value dtype or ",
                                                   "value shape (table ", index, ")"));
  }
  return absl::OkStatus();
}

// Writes `pieces` into one bundle at `prefix`, plus, whole, the tensors of
// `empty` entries (a slice cannot have zero rows).
absl::Status WriteBundle(const std::string& prefix, const std::vector<Piece>& pieces,
                         const std::vector<const Entry*>& empty) {
  tensorflow::BundleWriter writer(CheckpointEnv(), prefix);
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
    const int64_t value_bytes = ValueBytes(e.value_dtype, e.value_shape);
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

int64_t FileBytesPerRow(const Entry& e) {
  return FileBytesPerRow(e.key_dtype, e.value_dtype, e.value_shape, !e.scores_name.empty());
}

// Where `files` files of about equal bytes start: cuts[f] is the first row of
// file f in all entries' rows one after another; cuts[files] = all rows.
std::vector<int64_t> FileCuts(const std::vector<Entry>& entries, int64_t files) {
  int64_t total_bytes = 0, total_rows = 0;
  for (const Entry& e : entries) {
    total_bytes += e.rows() * FileBytesPerRow(e);
    total_rows += e.rows();
  }
  std::vector<int64_t> cuts(files + 1, total_rows);
  cuts[0] = 0;
  for (int64_t f = 1; f < files; ++f) {
    const int64_t target = total_bytes / files * f;  // bytes before file f
    int64_t bytes = 0, rows = 0;
    for (const Entry& e : entries) {
      const int64_t entry_bytes = e.rows() * FileBytesPerRow(e);
      if (bytes + entry_bytes > target) {
        cuts[f] = rows + (target - bytes) / FileBytesPerRow(e);
        break;
      }
      bytes += entry_bytes;
      rows += e.rows();
    }
  }
  return cuts;
}

class SaveTablesToBundleOp : public OpKernel {
 public:
  explicit SaveTablesToBundleOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, GetEntryAttrs(ctx, &tensor_names_, &entry_tables_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_files", &num_files_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::string prefix;
    OP_REQUIRES_OK(ctx, ScalarString(ctx->input(0), "prefix", &prefix));
    // The resources stay referenced, and their tables in place (TableUse),
    // until the snapshots are gone.
    std::vector<tensorflow::core::RefCountPtr<TableResource>> resources;
    TableUses uses;
    std::vector<Entry> entries(entry_tables_.size());
    int input = 1;
    for (size_t i = 0; i < entries.size(); ++i) {
      Entry& e = entries[i];
      e.keys_name = tensor_names_[3 * i];
      e.values_name = tensor_names_[3 * i + 1];
      e.scores_name = tensor_names_[3 * i + 2];
      e.offsets.push_back(0);
      const TableResource* first = nullptr;
      for (int64_t t = 0; t < entry_tables_[i]; ++t, ++input) {
        tensorflow::core::RefCountPtr<TableResource> resource;
        OP_REQUIRES_OK(ctx, tensorflow::LookupResource(
                                ctx, tensorflow::HandleFromInput(ctx, input), &resource));
        if (t == 0) {
          first = resource.get();
          e.key_dtype = resource->key_dtype();
          e.value_dtype = resource->value_dtype();
          e.value_shape = resource->value_shape();
        }
        OP_REQUIRES_OK(ctx, CheckSameTables(*first, *resource, input - 1, e.keys_name));
        uses.Add(*resource);
        std::unique_ptr<TableSnapshot> snapshot;
        OP_REQUIRES_OK(ctx, ToTfStatus(resource->table().Snapshot(&snapshot)));
        e.offsets.push_back(e.offsets.back() + snapshot->size());
        e.snapshots.push_back(std::move(snapshot));
        resources.push_back(std::move(resource));
      }
    }

    // Every row of every entry, in order, cut into one contiguous range per
    // file, of about equal bytes (files written at once finish together);
    // entries without rows go whole into the first file.
    std::vector<const Entry*> empty;
    int64_t total_rows = 0;
    for (const Entry& e : entries) {
      total_rows += e.rows();
      if (e.rows() == 0) empty.push_back(&e);
    }
    const int64_t files = num_files_;
    // A file without rows would be a bundle without a data file, which the
    // merge of the files cannot find.
    OP_REQUIRES(ctx, files <= std::max<int64_t>(1, total_rows),
                absl::InvalidArgumentError(absl::StrCat("num_files (", files,
                                                        ") must not exceed the rows to save (",
                                                        total_rows, ")")));
    const std::vector<int64_t> cuts = FileCuts(entries, files);
    std::vector<std::vector<Piece>> pieces(files);
    for (int64_t f = 0; f < files; ++f) {
      const int64_t lo = cuts[f], hi = cuts[f + 1];
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
    writers.reserve(files);
    for (int64_t f = 1; f < files; ++f) {
      try {
        writers.emplace_back(write, f);
      } catch (const std::system_error&) {  // no thread to be had: write it here
        write(f);
      }
    }
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

// ---------------------------------------------------------------------------
// Restore
// ---------------------------------------------------------------------------

// Bytes of rows read and inserted at a time: a few stored chunks, so the
// buffers stay small next to the tables while a batch's fixed costs (a
// thread, the insert's plan) vanish. (Four times more measured no faster.)
constexpr int64_t kRestoreBatchBytes = 32 << 20;

// One object to restore: its tables (a de.Variable's shards, in order), the
// names of its tensors and the row ranges to read them in.
struct RestoreEntry {
  std::string keys_name, values_name, scores_name;  // scores_name empty: not saved
  std::vector<TableResource*> tables;
  int64_t rows = 0;
  // Batches of rows, in order: each a list of [start, length) ranges that are
  // the keys' stored slices (a streamed checkpoint; reading exactly a stored
  // slice copies it straight into the buffer), or one range of all rows (a
  // tensor stored whole, which the reader can only read whole).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> batches;
  int64_t batch_capacity = 0;  // rows of the largest batch

  TableResource& first() const { return *tables.front(); }
  int64_t value_bytes() const { return ValueBytes(first().value_dtype(), first().value_shape()); }
};

// Checks that the checkpoint's tensor `name` has `dtype` and `shape`.
absl::Status CheckStored(tensorflow::BundleReader& reader, const std::string& name,
                         tensorflow::DataType dtype, const TensorShape& shape) {
  tensorflow::DataType stored_dtype;
  TensorShape stored_shape;
  TF_RETURN_IF_ERROR(reader.LookupDtypeAndShape(name, &stored_dtype, &stored_shape));
  if (stored_dtype == dtype && stored_shape == shape) return absl::OkStatus();
  std::string why = "the checkpoint was written for another table";
  if (stored_shape.dims() == 2 && shape.dims() == 2 &&
      stored_shape.dim_size(1) != shape.dim_size(1)) {
    why = absl::StrCat("its rows are of dim ", stored_shape.dim_size(1), ", the table's of dim ",
                       shape.dim_size(1));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "the checkpoint's ", name, " is ", tensorflow::DataTypeString(stored_dtype), " ",
      stored_shape.DebugString(), ", but the table takes ", tensorflow::DataTypeString(dtype),
      " ", shape.DebugString(), ": ", why));
}

// Checks an entry's tensors against its tables and cuts its rows into batches.
absl::Status PlanEntry(tensorflow::BundleReader& reader, RestoreEntry* e) {
  const TableResource& t = e->first();
  TensorShape keys_shape;
  tensorflow::DataType keys_dtype;
  TF_RETURN_IF_ERROR(reader.LookupDtypeAndShape(e->keys_name, &keys_dtype, &keys_shape));
  if (keys_shape.dims() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("the checkpoint's ", e->keys_name,
                                                   " has shape ", keys_shape.DebugString(),
                                                   ", expected one dimension of keys"));
  }
  e->rows = keys_shape.dim_size(0);
  TF_RETURN_IF_ERROR(CheckStored(reader, e->keys_name, t.key_dtype(), keys_shape));
  TF_RETURN_IF_ERROR(CheckStored(reader, e->values_name, t.value_dtype(),
                                 KeyedShape(keys_shape, t.value_shape())));
  if (!e->scores_name.empty()) {
    TF_RETURN_IF_ERROR(CheckStored(reader, e->scores_name, tensorflow::DT_INT64, keys_shape));
  }
  std::vector<TensorSlice> stored;
  TF_RETURN_IF_ERROR(reader.LookupTensorSlices(e->keys_name, &stored));
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const TensorSlice& slice : stored) {
    ranges.emplace_back(slice.start(0), slice.IsFullAt(0) ? e->rows : slice.length(0));
  }
  std::sort(ranges.begin(), ranges.end());
  if (ranges.empty()) ranges.emplace_back(0, e->rows);  // stored whole
  int64_t next = 0;
  for (const auto& [start, length] : ranges) {
    if (start != next) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the checkpoint's slices of ", e->keys_name, " do not cover its ", e->rows,
          " rows one after another (row ", next, " is followed by a slice at row ", start, ")"));
    }
    next = start + length;
  }
  if (next != e->rows) {
    return absl::InvalidArgumentError(absl::StrCat("the checkpoint's slices of ", e->keys_name,
                                                   " end at row ", next, " of its ", e->rows));
  }
  const int64_t row_bytes = FileBytesPerRow(t.key_dtype(), t.value_dtype(), t.value_shape(),
                                            !e->scores_name.empty());
  const int64_t batch_rows = std::max<int64_t>(1, kRestoreBatchBytes / row_bytes);
  int64_t in_batch = 0;
  for (const auto& range : ranges) {
    if (range.second == 0) continue;
    if (e->batches.empty() || in_batch + range.second > batch_rows) {
      e->batches.emplace_back();
      in_batch = 0;
    }
    e->batches.back().push_back(range);
    in_batch += range.second;
    e->batch_capacity = std::max(e->batch_capacity, in_batch);
  }
  return absl::OkStatus();
}

// A batch's rows as read from the checkpoint, in buffers reused across
// batches, plus the scratch that routes them to a variable's shards.
struct RestoreBuffers {
  Tensor keys, values, scores;
  Tensor routed_keys, routed_values, routed_scores;
  std::vector<int32_t> shard;
  std::vector<int64_t> shard_begin;

  absl::Status Allocate(OpKernelContext* ctx, const RestoreEntry& e) {
    const TableResource& t = e.first();
    const int64_t n = e.batch_capacity;
    const TensorShape rows({n});
    const TensorShape values_shape = KeyedShape(rows, t.value_shape());
    const TensorShape scores_shape({e.scores_name.empty() ? 0 : n});
    TF_RETURN_IF_ERROR(ctx->allocate_temp(t.key_dtype(), rows, &keys));
    TF_RETURN_IF_ERROR(ctx->allocate_temp(t.value_dtype(), values_shape, &values));
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT64, scores_shape, &scores));
    if (e.tables.size() > 1) {
      TF_RETURN_IF_ERROR(ctx->allocate_temp(t.key_dtype(), rows, &routed_keys));
      TF_RETURN_IF_ERROR(ctx->allocate_temp(t.value_dtype(), values_shape, &routed_values));
      TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT64, scores_shape, &routed_scores));
    }
    return absl::OkStatus();
  }
};

// The checkpoint a restore reads: TF's reader for its index and metadata,
// BundleSlices for the bytes.
class RestoreSource {
 public:
  explicit RestoreSource(const std::string& prefix)
      : reader_(CheckpointEnv(), prefix), slices_(&reader_, prefix, CheckpointEnv()) {}

  tensorflow::BundleReader& reader() { return reader_; }

  // Reads the stored slice `slice` of `name` into `out`: straight from the
  // file where BundleSlices can, else through the reader.
  absl::Status Read(const std::string& name, const TensorSlice& slice, Tensor* out) {
    const absl::Status direct = slices_.Read(name, slice, out);
    if (direct.code() != absl::StatusCode::kUnimplemented) return direct;
    if (out->IsAligned()) return reader_.LookupSlice(name, slice, out);
    // The reader fills tensors through flat<T>(), which aborts the process on
    // a misaligned one, and a batch's later ranges are views at any row.
    Tensor aligned(out->dtype(), out->shape());
    TF_RETURN_IF_ERROR(reader_.LookupSlice(name, slice, &aligned));
    std::memcpy(const_cast<char*>(out->tensor_data().data()), aligned.tensor_data().data(),
                aligned.TotalBytes());
    return absl::OkStatus();
  }

 private:
  tensorflow::BundleReader reader_;
  BundleSlices slices_;
};

// Reads one batch's rows into `b`; returns how many.
absl::Status ReadBatch(RestoreSource& source, const RestoreEntry& e,
                       const std::vector<std::pair<int64_t, int64_t>>& batch,
                       RestoreBuffers* b, int64_t* rows) {
  const int value_dims = 1 + e.first().value_shape().dims();
  int64_t at = 0;
  for (const auto& [start, length] : batch) {
    Tensor keys = b->keys.Slice(at, at + length);
    Tensor values = b->values.Slice(at, at + length);
    TF_RETURN_IF_ERROR(source.Read(e.keys_name, Rows(1, start, length), &keys));
    TF_RETURN_IF_ERROR(source.Read(e.values_name, Rows(value_dims, start, length), &values));
    if (!e.scores_name.empty()) {
      Tensor scores = b->scores.Slice(at, at + length);
      TF_RETURN_IF_ERROR(source.Read(e.scores_name, Rows(1, start, length), &scores));
    }
    at += length;
  }
  *rows = at;
  return absl::OkStatus();
}

// Groups rows [0, n) of `b` by the shard default_partition_fn sends their
// keys to (stable: a key's rows keep their order) into the routed buffers;
// shard s's rows become [shard_begin[s], shard_begin[s + 1]).
template <typename K>
void RouteRows(int64_t n, int32_t num_shards, int64_t value_bytes, bool with_scores,
               RestoreBuffers* b) {
  const K* keys = static_cast<const K*>(b->keys.data());
  b->shard.resize(n);
  b->shard_begin.assign(num_shards + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    b->shard[i] = ShardOfKey(keys[i], num_shards);
    ++b->shard_begin[b->shard[i] + 1];
  }
  for (int32_t s = 0; s < num_shards; ++s) b->shard_begin[s + 1] += b->shard_begin[s];
  std::vector<int64_t> next(b->shard_begin.begin(), b->shard_begin.end() - 1);
  K* out_keys = static_cast<K*>(b->routed_keys.data());
  char* out_values = static_cast<char*>(b->routed_values.data());
  const char* values = static_cast<const char*>(b->values.data());
  const int64_t* scores = static_cast<const int64_t*>(b->scores.data());
  int64_t* out_scores = static_cast<int64_t*>(b->routed_scores.data());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t to = next[b->shard[i]]++;
    out_keys[to] = keys[i];
    std::memcpy(out_values + to * value_bytes, values + i * value_bytes, value_bytes);
    if (with_scores) out_scores[to] = scores[i];
  }
}

// Inserts rows [0, n) of `b` into the entry's tables, routed by key when
// there are several.
absl::Status InsertBatch(const RestoreEntry& e, int64_t n, RestoreBuffers* b,
                         const std::vector<std::unique_ptr<Runner>>& runners) {
  const bool with_scores = !e.scores_name.empty();
  const auto scores_of = [&](const Tensor& t, int64_t at) {
    return with_scores ? static_cast<const uint64_t*>(t.data()) + at : nullptr;
  };
  if (e.tables.size() == 1) {
    return ToTfStatus(e.tables[0]->table().Insert(b->keys.data(), n, b->values.data(),
                                                  scores_of(b->scores, 0), *runners[0]));
  }
  const int32_t num_shards = static_cast<int32_t>(e.tables.size());
  const int64_t value_bytes = e.value_bytes();
  if (e.first().key_dtype() == tensorflow::DT_INT32) {
    RouteRows<int32_t>(n, num_shards, value_bytes, with_scores, b);
  } else {
    RouteRows<int64_t>(n, num_shards, value_bytes, with_scores, b);
  }
  const int64_t key_bytes = tensorflow::DataTypeSize(e.first().key_dtype());
  for (int32_t s = 0; s < num_shards; ++s) {
    const int64_t at = b->shard_begin[s], count = b->shard_begin[s + 1] - at;
    const char* keys = static_cast<const char*>(b->routed_keys.data()) + at * key_bytes;
    const char* values = static_cast<const char*>(b->routed_values.data()) + at * value_bytes;
    TF_RETURN_IF_ERROR(ToTfStatus(e.tables[s]->table().Insert(
        keys, count, values, scores_of(b->routed_scores, at), *runners[s])));
  }
  return absl::OkStatus();
}

class RestoreTablesFromBundleOp : public OpKernel {
 public:
  explicit RestoreTablesFromBundleOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, GetEntryAttrs(ctx, &tensor_names_, &entry_tables_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::string prefix;
    OP_REQUIRES_OK(ctx, ScalarString(ctx->input(0), "prefix", &prefix));
    RestoreSource source(prefix);
    OP_REQUIRES_OK(ctx, source.reader().status());
    std::vector<tensorflow::core::RefCountPtr<TableResource>> resources;
    TableUses uses;
    std::vector<RestoreEntry> entries(entry_tables_.size());
    std::vector<std::vector<std::unique_ptr<Runner>>> runners(entries.size());
    int input = 1;
    bool all_empty = true;
    for (size_t i = 0; i < entries.size(); ++i) {
      RestoreEntry& e = entries[i];
      e.keys_name = tensor_names_[3 * i];
      e.values_name = tensor_names_[3 * i + 1];
      e.scores_name = tensor_names_[3 * i + 2];
      for (int64_t t = 0; t < entry_tables_[i]; ++t, ++input) {
        tensorflow::core::RefCountPtr<TableResource> resource;
        OP_REQUIRES_OK(ctx, tensorflow::LookupResource(
                                ctx, tensorflow::HandleFromInput(ctx, input), &resource));
        OP_REQUIRES_OK(ctx, CheckSameTables(e.tables.empty() ? *resource : e.first(), *resource,
                                            input - 1, e.keys_name));
        uses.Add(*resource);
        all_empty = all_empty && resource->table().Size() == 0;
        runners[i].emplace_back();
        OP_REQUIRES_OK(ctx, resource->NewRunner(ctx, &runners[i].back()));
        e.tables.push_back(resource.get());
        resources.push_back(std::move(resource));
      }
      OP_REQUIRES_OK(ctx, PlanEntry(source.reader(), &e));
    }
    // Tables that hold entries lose them only to a checkpoint read through
    // once (the reader checks every chunk's checksum). Empty tables have
    // nothing to lose: a failed load just empties them again.
    if (!all_empty) {
      for (const RestoreEntry& e : entries) {
        OP_REQUIRES_OK(ctx, ForEachBatch(ctx, source, e, nullptr));
      }
    }
    for (const RestoreEntry& e : entries) {
      for (TableResource* t : e.tables) t->table().Clear();
    }
    for (size_t i = 0; i < entries.size(); ++i) {
      const absl::Status loaded = ForEachBatch(ctx, source, entries[i], &runners[i]);
      if (!loaded.ok()) {
        for (const RestoreEntry& e : entries) {
          for (TableResource* t : e.tables) t->table().Clear();
        }
        ctx->SetStatus(absl::Status(
            loaded.code(), absl::StrCat(loaded.message(), " (the restore left the tables empty)")));
        return;
      }
    }
  }

 private:
  // Reads every batch of `e`; inserts it too when `runners` is given. While
  // a batch is inserted, another thread reads the next one, so the file's
  // reads and checksums overlap the inserts.
  static absl::Status ForEachBatch(OpKernelContext* ctx, RestoreSource& source,
                                   const RestoreEntry& e,
                                   const std::vector<std::unique_ptr<Runner>>* runners) {
    const int64_t batches = static_cast<int64_t>(e.batches.size());
    RestoreBuffers buffers[2];
    int64_t rows[2] = {0, 0};
    TF_RETURN_IF_ERROR(buffers[0].Allocate(ctx, e));
    if (runners == nullptr) {  // a check: read everything, keep nothing
      for (const auto& batch : e.batches) {
        TF_RETURN_IF_ERROR(ReadBatch(source, e, batch, &buffers[0], &rows[0]));
      }
      return absl::OkStatus();
    }
    if (batches > 1) TF_RETURN_IF_ERROR(buffers[1].Allocate(ctx, e));
    if (batches > 0) TF_RETURN_IF_ERROR(ReadBatch(source, e, e.batches[0], &buffers[0], &rows[0]));
    for (int64_t i = 0; i < batches; ++i) {
      const int cur = i % 2, nxt = 1 - cur;
      absl::Status read;
      const auto read_next = [&] {
        read = ReadBatch(source, e, e.batches[i + 1], &buffers[nxt], &rows[nxt]);
      };
      std::thread reader_thread;
      bool read_here = false;
      if (i + 1 < batches) {
        try {
          reader_thread = std::thread(read_next);
        } catch (const std::system_error&) {  // no thread to be had: read after the insert
          read_here = true;
        }
      }
      const absl::Status inserted = InsertBatch(e, rows[cur], &buffers[cur], *runners);
      if (reader_thread.joinable()) reader_thread.join();
      if (read_here && inserted.ok()) read_next();
      TF_RETURN_IF_ERROR(inserted);
      TF_RETURN_IF_ERROR(read);
    }
    return absl::OkStatus();
  }

  std::vector<std::string> tensor_names_;
  std::vector<int64_t> entry_tables_;
};

REGISTER_KERNEL_BUILDER(Name("DynembRestoreTablesFromBundle").Device(tensorflow::DEVICE_CPU),
                        RestoreTablesFromBundleOp);

}  // namespace
}  // namespace dynemb
