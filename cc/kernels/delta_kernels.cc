// The kernels of online learning's delta ops (cc/ops/delta_ops.cc): writing
// a delta generation (cc/core/delta.h) from tables that track their changes
// (cc/core/table.h, "Change tracking"), and applying committed generations
// to a serving model's tables.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "cc/core/delta.h"
#include "cc/core/generation.h"
#include "cc/core/table_io.h"
#include "cc/kernels/file_io.h"
#include "cc/kernels/table_kernels.h"
#include "cc/kernels/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/io/path.h"
#include "tensorflow/core/platform/env.h"

namespace dynemb {
namespace {

using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

absl::Status ScalarInt(OpKernelContext* ctx, int index, const char* what, int64_t* out) {
  const Tensor& t = ctx->input(index);
  if (t.dims() != 0 || t.dtype() != tensorflow::DT_INT64) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be an int64 scalar, got shape ", t.shape().DebugString()));
  }
  *out = t.scalar<int64_t>()();
  return absl::OkStatus();
}

// A mark as the ops carry it: two int64 (epoch, stamp), bit-cast.
void PutMark(const ChangeMark& mark, Tensor* t) {
  auto flat = t->flat<int64_t>();
  std::memcpy(&flat(0), &mark.epoch, 8);
  std::memcpy(&flat(1), &mark.stamp, 8);
}

absl::Status GetMark(const Tensor& t, ChangeMark* mark) {
  if (t.dims() != 1 || t.NumElements() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "since must be a mark: an int64 vector of 2, got shape ", t.shape().DebugString()));
  }
  auto flat = t.flat<int64_t>();
  std::memcpy(&mark->epoch, &flat(0), 8);
  std::memcpy(&mark->stamp, &flat(1), 8);
  return absl::OkStatus();
}

// "role shard name bytes rows digest": what the manifest's file line holds
// after the item number.
std::string RoleEntry(DeltaRole role, int32_t shard, const std::string& name,
                      const SavedFile& saved) {
  return absl::StrCat(DeltaRoleName(role), " ", FileEntry(shard, name, saved));
}

// Opens `name` in `dir` for writing (the data files carry the save id in
// their name, and no manifest names them before they are complete: they are
// written in place).
absl::Status OpenSink(tensorflow::Env* env, const std::string& dir, const std::string& name,
                      bool sync, std::unique_ptr<WritableFileSink>* out) {
  std::unique_ptr<tensorflow::WritableFile> file;
  TF_RETURN_IF_ERROR(env->NewWritableFile(JoinPath(dir, name), &file));
  *out = std::make_unique<WritableFileSink>(std::move(file), sync);
  return absl::OkStatus();
}

std::string DataName(uint64_t serial, uint64_t sequence, int32_t item, DeltaRole role,
                     int32_t shard, const std::string& save_id) {
  return StemFileName(DeltaFileStem(serial, sequence, item, role, shard), save_id);
}

// ---------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------

// The inputs naming the file a writing op makes: dirpath, save_id,
// base_serial, sequence and item, from input `first` on.
struct GenerationInputs {
  std::string dir, save_id;
  int64_t serial = 0, sequence = 0, item = 0;
};

absl::Status ReadGenerationInputs(OpKernelContext* ctx, int first, GenerationInputs* in) {
  TF_RETURN_IF_ERROR(ScalarInput(ctx, first, "dirpath", &in->dir));
  TF_RETURN_IF_ERROR(ScalarInput(ctx, first + 1, "save_id", &in->save_id));
  TF_RETURN_IF_ERROR(CheckSaveId(in->save_id));
  TF_RETURN_IF_ERROR(ScalarInt(ctx, first + 2, "base_serial", &in->serial));
  TF_RETURN_IF_ERROR(ScalarInt(ctx, first + 3, "sequence", &in->sequence));
  TF_RETURN_IF_ERROR(ScalarInt(ctx, first + 4, "item", &in->item));
  if (in->serial < 0 || in->sequence < 0 || in->item < 0 || in->item >= 10000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "base_serial and sequence must be >= 0 and item in [0, 10000), got ", in->serial, ", ",
        in->sequence, ", ", in->item));
  }
  return absl::OkStatus();
}

class WriteChangesOp final : public TableOpKernel {
 public:
  explicit WriteChangesOp(OpKernelConstruction* ctx) : TableOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, GetShardFileAttrs(ctx, &options_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sync", &sync_));
  }

 protected:
  void ComputeWithTable(OpKernelContext* ctx, TableResource* resource, const Runner&) override {
    GenerationInputs in;
    OP_REQUIRES_OK(ctx, ReadGenerationInputs(ctx, 1, &in));
    const std::string& dir = in.dir;
    const std::string& save_id = in.save_id;
    const int64_t serial = in.serial, sequence = in.sequence, item = in.item;
    ChangeMark since;
    OP_REQUIRES_OK(ctx, GetMark(ctx->input(6), &since));
    const Tensor& full_t = ctx->input(7);
    OP_REQUIRES(ctx, full_t.dims() == 0,
                absl::InvalidArgumentError("full must be a bool scalar"));
    bool full = full_t.scalar<bool>()();

    Table& table = resource->table();
    ChangeMark until;
    const Status marked = table.Mark(&until);
    if (marked.code() == StatusCode::kFailedPrecondition) {
      // A table that does not track changes (track_changes false, a GPU
      // table) is written whole every time; its mark stays the zero mark.
      full = true;
      until = ChangeMark();
    } else {
      OP_REQUIRES_OK(ctx, ToTfStatus(marked));
    }
    tensorflow::Env* env = SaveEnv(sync_);
    if (!env->IsDirectory(dir).ok()) OP_REQUIRES_OK(ctx, env->RecursivelyCreateDir(dir));
    SaveOptions options = options_;
    options.save_id = save_id;
    const auto name = [&](DeltaRole role) {
      return DataName(static_cast<uint64_t>(serial), static_cast<uint64_t>(sequence),
                      static_cast<int32_t>(item), role, options_.shard_index, save_id);
    };
    std::string entries[2];
    if (!full) {
      const std::string rows_name = name(DeltaRole::kRows);
      const std::string removed_name = name(DeltaRole::kRemoved);
      std::unique_ptr<WritableFileSink> rows, removed;
      OP_REQUIRES_OK(ctx, OpenSink(env, dir, rows_name, sync_, &rows));
      OP_REQUIRES_OK(ctx, OpenSink(env, dir, removed_name, sync_, &removed));
      SavedFile rows_saved, removed_saved;
      bool complete = false;
      const absl::Status s = ToTfStatus(SaveChanges(table, since, until, options, rows.get(),
                                                    removed.get(), &rows_saved, &removed_saved,
                                                    &complete));
      if (!s.ok() || !complete) {
        rows.reset();
        removed.reset();
        env->DeleteFile(JoinPath(dir, rows_name)).IgnoreError();
        env->DeleteFile(JoinPath(dir, removed_name)).IgnoreError();
        OP_REQUIRES_OK(ctx, s);
        full = true;  // the window's changes are not all known: the whole table
      } else {
        entries[0] = RoleEntry(DeltaRole::kRows, options_.shard_index, rows_name, rows_saved);
        entries[1] =
            RoleEntry(DeltaRole::kRemoved, options_.shard_index, removed_name, removed_saved);
      }
    }
    if (full) {
      const std::string full_name = name(DeltaRole::kFull);
      std::unique_ptr<WritableFileSink> sink;
      OP_REQUIRES_OK(ctx, OpenSink(env, dir, full_name, sync_, &sink));
      SavedFile saved;
      const absl::Status s = ToTfStatus(SaveTable(table, options, sink.get(), &saved));
      if (!s.ok()) {
        sink.reset();
        env->DeleteFile(JoinPath(dir, full_name)).IgnoreError();
        ctx->SetStatus(s);
        return;
      }
      entries[0] = RoleEntry(DeltaRole::kFull, options_.shard_index, full_name, saved);
    }
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({2}), &out));
    out->flat<tensorflow::tstring>()(0) = entries[0];
    out->flat<tensorflow::tstring>()(1) = entries[1];
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({2}), &out));
    PutMark(until, out);
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({}), &out));
    out->scalar<bool>()() = full;
  }

 private:
  SaveOptions options_;
  bool sync_ = true;
};

class SaveDenseOp final : public tensorflow::OpKernel {
 public:
  explicit SaveDenseOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sync", &sync_));
  }

  void Compute(OpKernelContext* ctx) override {
    GenerationInputs in;
    OP_REQUIRES_OK(ctx, ReadGenerationInputs(ctx, 0, &in));
    const std::string& dir = in.dir;
    const std::string& save_id = in.save_id;
    const int64_t serial = in.serial, sequence = in.sequence, item = in.item;
    const Tensor& value = ctx->input(5);
    OP_REQUIRES(ctx, value.NumElements() >= 1 && value.NumElements() <= kMaxDim,
                absl::InvalidArgumentError(absl::StrCat(
                    "a dense variable must have 1 to ", kMaxDim, " elements, got shape ",
                    value.shape().DebugString())));
    TableOptions opt;
    opt.key_type = KeyType::kInt64;
    OP_REQUIRES(ctx, ToCoreValueType(value.dtype(), &opt.value_type),
                absl::InvalidArgumentError("unsupported dtype"));
    opt.dim = value.NumElements();
    SaveOptions options;
    options.save_id = save_id;
    options.with_scores = false;
    tensorflow::Env* env = SaveEnv(sync_);
    if (!env->IsDirectory(dir).ok()) OP_REQUIRES_OK(ctx, env->RecursivelyCreateDir(dir));
    const std::string name = DataName(static_cast<uint64_t>(serial), static_cast<uint64_t>(sequence),
                                      static_cast<int32_t>(item), DeltaRole::kDense, 0, save_id);
    std::unique_ptr<WritableFileSink> sink;
    OP_REQUIRES_OK(ctx, OpenSink(env, dir, name, sync_, &sink));
    const int64_t key = 0;
    SavedFile saved;
    const absl::Status s = ToTfStatus(
        SaveRows(opt, options, &key, 1, value.tensor_data().data(), nullptr, sink.get(), &saved));
    if (!s.ok()) {
      sink.reset();
      env->DeleteFile(JoinPath(dir, name)).IgnoreError();
      ctx->SetStatus(s);
      return;
    }
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = RoleEntry(DeltaRole::kDense, 0, name, saved);
  }

 private:
  bool sync_ = true;
};

// The committed manifests of a directory: serial -> sequences.
absl::Status ListManifests(tensorflow::Env* env, const std::string& dir,
                           std::map<uint64_t, std::set<uint64_t>>* out) {
  out->clear();
  if (!env->IsDirectory(dir).ok()) return absl::OkStatus();
  std::vector<std::string> children;
  TF_RETURN_IF_ERROR(env->GetChildren(dir, &children));
  for (const std::string& name : children) {
    uint64_t serial, sequence;
    if (ParseDeltaManifestName(name, &serial, &sequence)) (*out)[serial].insert(sequence);
  }
  return absl::OkStatus();
}

absl::Status ReadDeltaManifest(tensorflow::Env* env, const std::string& dir, uint64_t serial,
                               uint64_t sequence, DeltaManifest* out) {
  const std::string path = JoinPath(dir, DeltaManifestName(serial, sequence));
  std::string text;
  TF_RETURN_IF_ERROR(tensorflow::ReadFileToString(env, path, &text));
  const Status parsed = ParseDeltaManifest(text, out);
  if (!parsed.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(parsed.code()),
                        absl::StrCat(path, ": ", parsed.message()));
  }
  if (out->base_serial != serial || out->sequence != sequence) {
    return absl::DataLossError(absl::StrCat(
        path, ": the manifest says base serial ", out->base_serial, ", sequence ", out->sequence,
        ", its name says ", serial, ", ", sequence, " (a manifest was renamed)"));
  }
  return absl::OkStatus();
}

// The newest base's serial and its committed sequences, checked to run from
// 0 without a gap. *found false when the directory holds no base.
absl::Status NewestBase(tensorflow::Env* env, const std::string& dir, bool* found,
                        uint64_t* serial, std::vector<uint64_t>* sequences) {
  std::map<uint64_t, std::set<uint64_t>> manifests;
  TF_RETURN_IF_ERROR(ListManifests(env, dir, &manifests));
  *found = false;
  // A serial without its sequence 0 is not a base (its base's manifest was
  // deleted by hand): the newest serial that has one is.
  for (auto it = manifests.rbegin(); it != manifests.rend(); ++it) {
    if (it->second.count(0) == 0) continue;
    *found = true;
    *serial = it->first;
    sequences->assign(it->second.begin(), it->second.end());
    for (size_t k = 0; k < sequences->size(); ++k) {
      if ((*sequences)[k] != k) {
        return absl::DataLossError(absl::StrCat(
            dir, ": the deltas of base serial ", *serial, " have a gap: sequence ", k,
            " is missing while sequence ", (*sequences)[k],
            " is there (", DeltaManifestName(*serial, k), " was deleted)"));
      }
    }
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

class WriteDeltaManifestOp final : public tensorflow::OpKernel {
 public:
  explicit WriteDeltaManifestOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sync", &sync_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::string dir, base_id, save_id;
    int64_t serial = 0, sequence = 0;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 0, "dirpath", &dir));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 1, "base_id", &base_id));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 2, "save_id", &save_id));
    OP_REQUIRES_OK(ctx, ScalarInt(ctx, 3, "base_serial", &serial));
    OP_REQUIRES_OK(ctx, ScalarInt(ctx, 4, "sequence", &sequence));
    std::string text = absl::StrCat("tensorflow_dynemb delta ", kDeltaManifestVersion,
                                    "\nbase_id ", base_id, "\nbase_serial ", serial,
                                    "\nsequence ", sequence, "\nsave_id ", save_id, "\n");
    const auto items = ctx->input(5).flat<tensorflow::tstring>();
    const auto files = ctx->input(6).flat<tensorflow::tstring>();
    // tstring as a string_view: TF 2.16's absl::StrAppend takes no tstring.
    for (int64_t i = 0; i < items.size(); ++i) {
      absl::StrAppend(&text, absl::string_view(items(i).data(), items(i).size()), "\n");
    }
    for (int64_t i = 0; i < files.size(); ++i) {
      absl::StrAppend(&text, "file ", absl::string_view(files(i).data(), files(i).size()), "\n");
    }
    // Through the parser: a manifest this op writes always reads back.
    DeltaManifest manifest;
    const Status parsed = ParseDeltaManifest(WithCrcLine(text), &manifest);
    OP_REQUIRES(ctx, parsed.ok(),
                absl::InvalidArgumentError(absl::StrCat(
                    "the delta manifest's items and files do not make a valid manifest: ",
                    parsed.message())));
    OP_REQUIRES(ctx, manifest.sequence > 0 || std::all_of(manifest.items.begin(),
                                                          manifest.items.end(),
                                                          [](const DeltaItem& it) {
                                                            return it.dense || it.replace;
                                                          }),
                absl::InvalidArgumentError("a base (sequence 0) must replace every table"));

    tensorflow::Env* env = SaveEnv(sync_);
    const std::string name = DeltaManifestName(manifest.base_serial, manifest.sequence);
    const std::string path = JoinPath(dir, name);
    // The data files' directory entries first, then the manifest, aside,
    // synced, renamed: the rename is the commit (as generation.h's).
    if (sync_) OP_REQUIRES_OK(ctx, SyncDirectory(dir));
    const std::string tmp = path + ".tmp-" + save_id;
    OP_REQUIRES_OK(ctx, WriteManifestFile(env, tmp, SerializeDeltaManifest(manifest), sync_));
    OP_REQUIRES_OK(ctx, env->RenameFile(tmp, path));
    if (sync_) OP_REQUIRES_OK(ctx, SyncDirectory(dir));

    // What no committed manifest of this base names: older bases' files (a
    // reader still on them moves to this base), killed writes' files and
    // manifests being written. Best effort: the next write deletes the rest.
    std::map<uint64_t, std::set<uint64_t>> manifests;
    // The data files the committed manifests of this serial name (an
    // unreadable manifest: delete nothing this time).
    bool readable = ListManifests(env, dir, &manifests).ok();
    std::set<std::string> named;
    for (uint64_t k : manifests[manifest.base_serial]) {
      DeltaManifest m;
      readable = readable && ReadDeltaManifest(env, dir, manifest.base_serial, k, &m).ok();
      for (const DeltaFile& f : m.files) named.insert(f.name);
    }
    if (readable) {
      DeleteOwned(env, dir, [&](const std::string& child) {
        uint64_t s, k;
        if (!ParseDeltaFileName(child, &s, &k)) return false;
        if (s < manifest.base_serial) return true;
        if (s > manifest.base_serial) return false;  // not ours to judge
        if (ParseDeltaManifestName(child, &s, &k) || named.count(child) > 0) return false;
        // A data file no manifest names: from a killed write, of a write that
        // wrote a table's changes and then the whole table (one of its shards
        // could not tell what changed), older than this one, or of this
        // sequence with another save id.
        return k <= manifest.sequence;
      });
    }
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = name;
  }

 private:
  bool sync_ = true;
};

class DeltaStateOp final : public tensorflow::OpKernel {
 public:
  using tensorflow::OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    std::string dir;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 0, "dirpath", &dir));
    tensorflow::Env* env = CheckpointEnv();
    bool found = false;
    uint64_t serial = 0;
    std::vector<uint64_t> sequences;
    OP_REQUIRES_OK(ctx, NewestBase(env, dir, &found, &serial, &sequences));
    DeltaManifest base, last;
    if (found) {
      OP_REQUIRES_OK(ctx, ReadDeltaManifest(env, dir, serial, 0, &base));
      OP_REQUIRES_OK(ctx, ReadDeltaManifest(env, dir, serial, sequences.back(), &last));
      OP_REQUIRES(ctx, last.base_id == base.base_id,
                  absl::DataLossError(absl::StrCat(
                      dir, ": ", DeltaManifestName(serial, sequences.back()),
                      " is a delta of base ", last.base_id, ", but the base of serial ", serial,
                      " is ", base.base_id)));
    }
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = found ? base.base_id : "";
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &out));
    out->scalar<int64_t>()() = found ? static_cast<int64_t>(serial) : -1;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({}), &out));
    out->scalar<int64_t>()() = found ? static_cast<int64_t>(sequences.back()) : -1;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = found ? last.save_id : "";
    // The item lines of the last generation, as the manifest writes them.
    std::vector<std::string> lines;
    if (found) {
      const std::string text = SerializeDeltaManifest(last);
      size_t begin = 0;
      while (begin < text.size()) {
        const size_t end = text.find('\n', begin);
        const std::string line = text.substr(begin, end - begin);
        if (line.rfind("table ", 0) == 0 || line.rfind("dense ", 0) == 0) lines.push_back(line);
        begin = end + 1;
      }
    }
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            4, TensorShape({static_cast<int64_t>(lines.size())}), &out));
    for (size_t i = 0; i < lines.size(); ++i) out->flat<tensorflow::tstring>()(i) = lines[i];
  }
};

// ---------------------------------------------------------------------------
// Applying
// ---------------------------------------------------------------------------

// One serving table item: its shard tables.
struct ServedTable {
  std::string identity;
  std::vector<tensorflow::core::RefCountPtr<TableResource>> shards;
};

// The files of one item a serving shard reads, and how (cf. StageLoadOp's plan).
struct ShardRead {
  std::vector<std::unique_ptr<FileSource>> files;
  LoadOptions options;

  std::vector<ByteSource*> sources() const {
    std::vector<ByteSource*> out;
    for (const auto& f : files) out.push_back(f.get());
    return out;
  }
};

// How serving shard `shard` of `num_shards` reads the files of `role` of a
// generation's item saved with item.num_shards shards.
absl::Status PlanShardRead(const std::string& dir, const DeltaManifest& m, int32_t item_index,
                           DeltaRole role, int32_t shard, int32_t num_shards, int64_t chunk_rows,
                           ShardRead* out) {
  const DeltaItem& item = m.items[item_index];
  out->options = LoadOptions();
  out->options.chunk_rows = chunk_rows;
  out->options.clear_first = false;
  out->options.validate_first = false;
  bool only_own = false;
  if (num_shards > 1) {
    if (item.num_shards == num_shards) {
      only_own = true;
      if (item.partitioner == "default") {
        out->options.num_shards = num_shards;
        out->options.shard_index = shard;
        out->options.verify_routing = true;
      }
    } else if (item.partitioner == "default") {
      out->options.num_shards = num_shards;
      out->options.shard_index = shard;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "the delta's table ", item.identity, " has ", item.num_shards,
          " shards routed by a custom partitioner and the serving variable has ", num_shards,
          ": changes load into another number of shards only with de.default_partition_fn"));
    }
  }
  for (const DeltaFile& f : m.files) {
    if (f.item != item_index || f.role != role || (only_own && f.shard != shard)) continue;
    out->options.expected.push_back(
        ExpectedFile{m.save_id, f.shard, item.num_shards, f.rows, f.bytes, f.digest});
    std::unique_ptr<FileSource> source;
    TF_RETURN_IF_ERROR(OpenFile(JoinPath(dir, f.name), &out->options.expected.back(), &source));
    out->files.push_back(std::move(source));
  }
  return absl::OkStatus();
}

// Applications of generations are serialized: two at once on the same
// tables would interleave their rows (each is idempotent, not atomic).
absl::Mutex apply_mu(absl::kConstInit);

class ApplyDeltasOp final : public tensorflow::OpKernel {
 public:
  explicit ApplyDeltasOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_identities", &table_identities_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_shards", &table_shards_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dense_identities", &dense_identities_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("max_generations", &max_generations_));
    int num_tables = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_tables", &num_tables));
    OP_REQUIRES(ctx, table_identities_.size() == table_shards_.size(),
                absl::InvalidArgumentError(absl::StrCat(
                    "table_identities and table_shards must have one entry per item, got ",
                    table_identities_.size(), " and ", table_shards_.size())));
    int64_t total = 0;
    for (int64_t n : table_shards_) {
      OP_REQUIRES(ctx, n >= 1, absl::InvalidArgumentError("table_shards must be >= 1"));
      total += n;
    }
    OP_REQUIRES(ctx, total == num_tables,
                absl::InvalidArgumentError(absl::StrCat(
                    "table_shards must add up to the number of tables ", num_tables, ", got ",
                    total)));
    num_tables_ = num_tables;
  }

  void Compute(OpKernelContext* ctx) override {
    std::string dir, state_base_id;
    int64_t state_serial = 0, state_sequence = 0;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 0, "dirpath", &dir));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 1, "base_id", &state_base_id));
    OP_REQUIRES_OK(ctx, ScalarInt(ctx, 2, "base_serial", &state_serial));
    OP_REQUIRES_OK(ctx, ScalarInt(ctx, 3, "sequence", &state_sequence));
    std::vector<ServedTable> tables(table_identities_.size());
    int input = 4;
    for (size_t i = 0; i < tables.size(); ++i) {
      tables[i].identity = table_identities_[i];
      for (int64_t j = 0; j < table_shards_[i]; ++j, ++input) {
        tensorflow::core::RefCountPtr<TableResource> resource;
        OP_REQUIRES_OK(ctx, tensorflow::LookupResource(
                                ctx, tensorflow::HandleFromInput(ctx, input), &resource));
        tables[i].shards.push_back(std::move(resource));
      }
    }
    const int dense_begin = 4 + num_tables_;
    std::vector<Tensor> dense;
    for (size_t j = 0; j < dense_identities_.size(); ++j) dense.push_back(ctx->input(dense_begin + j));
    OP_REQUIRES(ctx, dense.size() == static_cast<size_t>(ctx->num_outputs() - 4),
                absl::InvalidArgumentError(absl::StrCat(
                    "dense_identities must have one entry per dense input, got ",
                    dense_identities_.size(), " for ", ctx->num_outputs() - 4)));

    absl::MutexLock lock(&apply_mu);
    tensorflow::Env* env = CheckpointEnv();
    bool found = false;
    uint64_t serial = 0;
    std::vector<uint64_t> sequences;
    OP_REQUIRES_OK(ctx, NewestBase(env, dir, &found, &serial, &sequences));
    std::string base_id = state_base_id;
    int64_t applied = 0, new_serial = state_serial, new_sequence = state_sequence;
    if (found) {
      DeltaManifest base;
      OP_REQUIRES_OK(ctx, ReadDeltaManifest(env, dir, serial, 0, &base));
      const bool have_state = state_sequence >= 0;
      OP_REQUIRES(ctx, !have_state || state_serial <= static_cast<int64_t>(serial),
                  absl::FailedPreconditionError(absl::StrCat(
                      dir, ": this model has applied base serial ", state_serial,
                      ", but the directory's newest base is serial ", serial,
                      ": the directory was replaced or rolled back")));
      uint64_t start = 0;
      if (have_state && state_serial == static_cast<int64_t>(serial)) {
        OP_REQUIRES(ctx, state_base_id == base.base_id,
                    absl::FailedPreconditionError(absl::StrCat(
                        dir, ": this model holds base ", state_base_id, " and its deltas, but base "
                        "serial ", serial, " of the directory is base ", base.base_id,
                        ": its deltas are for another base")));
        OP_REQUIRES(ctx, static_cast<uint64_t>(state_sequence) <= sequences.back(),
                    absl::FailedPreconditionError(absl::StrCat(
                        dir, ": this model has applied sequence ", state_sequence, " of base ",
                        base.base_id, ", but the directory ends at sequence ", sequences.back(),
                        ": the directory was rolled back")));
        start = static_cast<uint64_t>(state_sequence) + 1;
      }
      for (uint64_t k = start; k <= sequences.back(); ++k) {
        if (max_generations_ > 0 && applied >= max_generations_) break;
        DeltaManifest m;
        OP_REQUIRES_OK(ctx, ReadDeltaManifest(env, dir, serial, k, &m));
        OP_REQUIRES(ctx, m.base_id == base.base_id,
                    absl::DataLossError(absl::StrCat(
                        dir, ": ", DeltaManifestName(serial, k), " is a delta of base ",
                        m.base_id, ", but the base of serial ", serial, " is ", base.base_id)));
        OP_REQUIRES_OK(ctx, ApplyOne(ctx, dir, m, &tables, &dense));
        ++applied;
        base_id = base.base_id;
        new_serial = static_cast<int64_t>(serial);
        new_sequence = static_cast<int64_t>(k);
      }
    }
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = base_id;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &out));
    out->scalar<int64_t>()() = new_serial;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({}), &out));
    out->scalar<int64_t>()() = new_sequence;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({}), &out));
    out->scalar<int64_t>()() = applied;
    for (size_t j = 0; j < dense.size(); ++j) ctx->set_output(4 + static_cast<int>(j), dense[j]);
  }

 private:
  // Applies generation `m`: every check first, then the tables, then the
  // dense values (into *dense).
  absl::Status ApplyOne(OpKernelContext* ctx, const std::string& dir, const DeltaManifest& m,
                        std::vector<ServedTable>* tables, std::vector<Tensor>* dense) {
    const std::string where = absl::StrCat(dir, "/", DeltaManifestName(m.base_serial, m.sequence));
    struct TablePlan {
      ServedTable* table;
      int32_t item;
      // Per serving shard: the reads, in the order they apply.
      std::vector<std::vector<ShardRead>> reads;
    };
    std::vector<TablePlan> plans;
    std::vector<std::pair<size_t, Tensor>> new_dense;
    for (int32_t i = 0; i < static_cast<int32_t>(m.items.size()); ++i) {
      const DeltaItem& item = m.items[i];
      const auto matches = [&](const std::string& identity) {
        return identity == item.identity || (!item.alt.empty() && identity == item.alt);
      };
      if (item.dense) {
        size_t j = 0;
        while (j < dense_identities_.size() && !matches(dense_identities_[j])) ++j;
        if (j == dense_identities_.size()) return NotInModel(where, item);
        Tensor value;
        TF_RETURN_IF_ERROR(ReadDense(dir, m, i, (*dense)[j], &value));
        new_dense.emplace_back(j, std::move(value));
        continue;
      }
      size_t t = 0;
      while (t < tables->size() && !matches((*tables)[t].identity)) ++t;
      if (t == tables->size()) return NotInModel(where, item);
      ServedTable& served = (*tables)[t];
      const int32_t n = static_cast<int32_t>(served.shards.size());
      TablePlan plan{&served, i, {}};
      plan.reads.resize(n);
      for (int32_t shard = 0; shard < n; ++shard) {
        const TableOptions& opt = served.shards[shard]->options();
        if (opt.key_type != item.key_type || opt.value_type != item.value_type ||
            opt.dim != item.dim) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": the delta's table ", item.identity, " has ",
              Describe(item.key_type, item.value_type, item.dim), " but the model's has ",
              Describe(opt.key_type, opt.value_type, opt.dim)));
        }
        const std::vector<DeltaRole> roles =
            item.replace ? std::vector<DeltaRole>{DeltaRole::kFull}
                         : std::vector<DeltaRole>{DeltaRole::kRemoved, DeltaRole::kRows};
        for (DeltaRole role : roles) {
          ShardRead read;
          TF_RETURN_IF_ERROR(PlanShardRead(dir, m, i, role, shard, n, kChunkRows, &read));
          // Every file is read through once before anything changes.
          TF_RETURN_IF_ERROR(ToTfStatus(CheckTableFiles(read.sources(), opt, read.options)));
          plan.reads[shard].push_back(std::move(read));
        }
      }
      plans.push_back(std::move(plan));
    }

    for (TablePlan& plan : plans) {
      const DeltaItem& item = m.items[plan.item];
      for (size_t shard = 0; shard < plan.table->shards.size(); ++shard) {
        TableResource* resource = plan.table->shards[shard].get();
        std::unique_ptr<Runner> runner;
        TF_RETURN_IF_ERROR(resource->NewRunner(ctx, &runner));
        const absl::Status s = item.replace
                                   ? Replace(resource, &plan.reads[shard][0], *runner)
                                   : Update(resource, &plan.reads[shard], *runner);
        if (!s.ok()) {
          return absl::Status(s.code(), absl::StrCat(
              where, ": ", s.message(), " (every file had been checked before the tables "
              "changed, so the storage failed or memory ran out: the model holds part of this "
              "generation; applying it again is safe)"));
        }
      }
    }
    for (auto& [j, value] : new_dense) (*dense)[j] = value;
    return absl::OkStatus();
  }

  // The table's content becomes the files': loaded into a table aside that
  // takes the old one's place (a lookup sees one or the other), or, where the
  // device cannot stage a table, cleared and loaded in place.
  static absl::Status Replace(TableResource* resource, ShardRead* read, const Runner& runner) {
    for (ByteSource* source : read->sources()) TF_RETURN_IF_ERROR(ToTfStatus(source->Rewind()));
    uint64_t rows = 0;
    for (const ExpectedFile& f : read->options.expected) rows += f.rows;
    std::unique_ptr<Table> staged;
    const absl::Status made = resource->NewStagingTable(static_cast<int64_t>(rows), &staged);
    if (made.ok()) {
      TF_RETURN_IF_ERROR(ToTfStatus(LoadTable(read->sources(), *staged, read->options, runner)));
      resource->ReplaceTable(std::move(staged));
      return absl::OkStatus();
    }
    if (!absl::IsUnimplemented(made)) return made;
    const TableResource::TableUse use(*resource);
    resource->table().Clear();
    return ToTfStatus(resource->LoadFiles(read->sources(), read->options, runner));
  }

  // The removed keys go, then the rows are upserted, each under its shard's lock.
  static absl::Status Update(TableResource* resource, std::vector<ShardRead>* reads,
                             const Runner& runner) {
    const TableResource::TableUse use(*resource);
    for (ShardRead& read : *reads) {
      for (ByteSource* source : read.sources()) TF_RETURN_IF_ERROR(ToTfStatus(source->Rewind()));
      TF_RETURN_IF_ERROR(ToTfStatus(resource->LoadFiles(read.sources(), read.options, runner)));
    }
    return absl::OkStatus();
  }

  // Reads item `i`'s dense file into a new tensor like `current`.
  static absl::Status ReadDense(const std::string& dir, const DeltaManifest& m, int32_t i,
                                const Tensor& current, Tensor* out) {
    const DeltaItem& item = m.items[i];
    ValueType have;
    if (!ToCoreValueType(current.dtype(), &have) || have != item.value_type ||
        current.shape().dims() != static_cast<int>(item.shape.size())) {
      return DenseMismatch(dir, m, item, current);
    }
    for (size_t d = 0; d < item.shape.size(); ++d) {
      if (current.shape().dim_size(static_cast<int>(d)) != item.shape[d]) {
        return DenseMismatch(dir, m, item, current);
      }
    }
    const DeltaFile* file = nullptr;
    for (const DeltaFile& f : m.files) {
      if (f.item == i) file = &f;
    }
    ExpectedFile expected{m.save_id, 0, 1, file->rows, file->bytes, file->digest};
    std::unique_ptr<FileSource> source;
    TF_RETURN_IF_ERROR(OpenFile(JoinPath(dir, file->name), &expected, &source));
    TableOptions opt;
    opt.key_type = KeyType::kInt64;
    opt.value_type = item.value_type;
    opt.dim = current.NumElements();
    Tensor value(current.dtype(), current.shape());
    int64_t rows = 0;
    LoadOptions options;
    options.expected = {expected};
    options.consumer = [&](const void*, int64_t n, const void* values, const uint64_t*,
                           bool removal) -> Status {
      if (removal || n != 1 || rows != 0) {
        return Status(StatusCode::kDataLoss, "a dense file must hold one row");
      }
      std::memcpy(const_cast<char*>(value.tensor_data().data()), values, value.TotalBytes());
      rows += n;
      return Status::Ok();
    };
    TF_RETURN_IF_ERROR(ToTfStatus(CheckTableFiles({source.get()}, opt, options)));
    if (rows != 1) {
      return absl::DataLossError(absl::StrCat(file->name, ": a dense file must hold one row"));
    }
    *out = std::move(value);
    return absl::OkStatus();
  }

  static absl::Status DenseMismatch(const std::string& dir, const DeltaManifest& m,
                                    const DeltaItem& item, const Tensor& current) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, "/", DeltaManifestName(m.base_serial, m.sequence), ": the delta's dense variable ",
        item.identity, " is ", ValueTypeName(item.value_type), " of shape ",
        DeltaShapeString(item.shape), ", but the model's is ",
        tensorflow::DataTypeString(current.dtype()), " of shape ", current.shape().DebugString()));
  }

  absl::Status NotInModel(const std::string& where, const DeltaItem& item) const {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": the delta's ", item.dense ? "dense variable " : "table ", item.identity,
        item.alt.empty() ? "" : absl::StrCat(" (or ", item.alt, ")"),
        " is not in the model, whose ", item.dense ? "dense variables" : "tables", " are [",
        absl::StrJoin(item.dense ? dense_identities_ : table_identities_, ", "),
        "]: the model was not exported from the trainer that writes this directory"));
  }

  static constexpr int64_t kChunkRows = 65536;
  std::vector<std::string> table_identities_;
  std::vector<int64_t> table_shards_;
  std::vector<std::string> dense_identities_;
  int64_t max_generations_ = 0;
  int num_tables_ = 0;
};

}  // namespace

#define DYNEMB_REGISTER_CPU(name, kernel) \
  REGISTER_KERNEL_BUILDER(Name(name).Device(tensorflow::DEVICE_CPU), kernel)

DYNEMB_REGISTER_CPU("DynembTableWriteChanges", WriteChangesOp);
DYNEMB_REGISTER_CPU("DynembSaveDense", SaveDenseOp);
DYNEMB_REGISTER_CPU("DynembWriteDeltaManifest", WriteDeltaManifestOp);
DYNEMB_REGISTER_CPU("DynembDeltaState", DeltaStateOp);
DYNEMB_REGISTER_CPU("DynembApplyDeltas", ApplyDeltasOp);

#undef DYNEMB_REGISTER_CPU

}  // namespace dynemb
