// The table file ops' kernels (file_kernels.h), and their CPU registrations.

#include "cc/kernels/file_kernels.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cc/core/generation.h"
#include "cc/core/table_io.h"
#include "cc/kernels/direct_io.h"
#include "cc/kernels/file_io.h"
#include "cc/kernels/table_resource.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.pb.h"
#include "tensorflow/core/lib/io/path.h"
#include "tensorflow/core/platform/env.h"

namespace dynemb {

using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

// ---------------------------------------------------------------------------
// Save
// ---------------------------------------------------------------------------
SaveToFileOp::SaveToFileOp(OpKernelConstruction* ctx) : TableOpKernel(ctx) {
  OP_REQUIRES_OK(ctx, GetShardFileAttrs(ctx, &options_));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("generation", &generation_));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("sync", &sync_));
}

void SaveToFileOp::ComputeWithTable(OpKernelContext* ctx, TableResource* resource,
                                    const Runner&) {
  std::string dir, file_name, save_id;
  OP_REQUIRES_OK(ctx, ScalarInput(ctx, 1, "dirpath", &dir));
  OP_REQUIRES_OK(ctx, ScalarInput(ctx, 2, "file_name", &file_name));
  OP_REQUIRES_OK(ctx, ScalarInput(ctx, 3, "save_id", &save_id));
  OP_REQUIRES_OK(ctx, CheckFileName(file_name, "file_name"));
  OP_REQUIRES_OK(ctx, CheckSaveId(save_id));
  tensorflow::Env* env = SaveEnv(sync_);
  // The directory may be a graph-time tensor that Python never saw: create it here.
  if (!env->IsDirectory(dir).ok()) OP_REQUIRES_OK(ctx, env->RecursivelyCreateDir(dir));
  // A generation's data file carries the save id in its name, and no
  // manifest names it before it is complete: it is written in place. A
  // file on its own is written aside and renamed, so its name never holds a
  // torn file.
  const std::string name = generation_ ? StemFileName(file_name, save_id) : file_name;
  const std::string path = JoinPath(dir, name);
  const std::string written = generation_ ? path : path + ".tmp-" + save_id;
  SaveOptions options = options_;
  options.save_id = save_id;
  SavedFile saved;
  {
    std::unique_ptr<tensorflow::WritableFile> file;
    OP_REQUIRES_OK(ctx, env->NewWritableFile(written, &file));
    WritableFileSink sink(std::move(file), sync_);
    const absl::Status s = ToTfStatus(SaveTable(resource->table(), options, &sink, &saved));
    if (!s.ok()) {
      env->DeleteFile(written).IgnoreError();
      ctx->SetStatus(s);
      return;
    }
  }
  if (!generation_) {
    OP_REQUIRES_OK(ctx, env->RenameFile(written, path));
    if (sync_) OP_REQUIRES_OK(ctx, SyncDirectory(dir));
    // What killed saves of this file left (this package's older saves
    // wrote `<name>.tmp`).
    const std::string tmp = file_name + ".tmp";
    DeleteOwned(env, dir, [&](const std::string& child) {
      return child == tmp || (child.size() == tmp.size() + 1 + kSaveIdChars &&
                              child.compare(0, tmp.size() + 1, tmp + "-") == 0 &&
                              IsSaveId(child.substr(tmp.size() + 1)));
    });
  }
  Tensor* entry;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &entry));
  entry->scalar<tensorflow::tstring>()() = FileEntry(options_.shard_index, name, saved);
}

namespace {

class NewSaveIdOp final : public tensorflow::OpKernel {
 public:
  using tensorflow::OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = NewSaveId();
  }
};

class WriteManifestOp final : public tensorflow::OpKernel {
 public:
  explicit WriteManifestOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    tensorflow::DataType key_dtype, value_dtype;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("key_dtype", &key_dtype));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("value_dtype", &value_dtype));
    OP_REQUIRES(ctx, ToCoreKeyType(key_dtype, &manifest_.key_type),
                absl::InvalidArgumentError("unsupported key_dtype"));
    OP_REQUIRES(ctx, ToCoreValueType(value_dtype, &manifest_.value_type),
                absl::InvalidArgumentError("unsupported value_dtype"));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dim", &manifest_.dim));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("partitioner", &manifest_.partitioner));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("sync", &sync_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::string dir, prefix, save_id;
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 0, "dirpath", &dir));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 1, "prefix", &prefix));
    OP_REQUIRES_OK(ctx, ScalarInput(ctx, 2, "save_id", &save_id));
    OP_REQUIRES_OK(ctx, CheckFileName(prefix, "prefix"));
    OP_REQUIRES_OK(ctx, CheckSaveId(save_id));
    const Tensor& entries_t = ctx->input(3);
    OP_REQUIRES(ctx, entries_t.dims() == 1 && entries_t.NumElements() > 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "file_entries must be a non-empty vector, got shape ",
                    entries_t.shape().DebugString())));
    const auto entries = entries_t.flat<tensorflow::tstring>();
    Manifest manifest = manifest_;
    manifest.save_id = save_id;
    manifest.num_shards = static_cast<int32_t>(entries.size());
    manifest.files.resize(entries.size());
    for (int64_t i = 0; i < entries.size(); ++i) {
      OP_REQUIRES_OK(ctx, ParseFileEntry(std::string(entries(i)), &manifest.files[i]));
    }
    std::sort(manifest.files.begin(), manifest.files.end(),
              [](const ManifestFile& a, const ManifestFile& b) {
                return a.shard_index < b.shard_index;
              });
    const std::string suffix = "." + save_id + ".dynemb";
    std::vector<std::string> stems;
    std::set<std::string> keep = {prefix + kManifestSuffix};
    for (int32_t i = 0; i < manifest.num_shards; ++i) {
      const ManifestFile& f = manifest.files[i];
      OP_REQUIRES(ctx,
                  f.shard_index == i && f.name.size() > suffix.size() &&
                      f.name.compare(f.name.size() - suffix.size(), suffix.size(), suffix) == 0,
                  absl::InvalidArgumentError(absl::StrCat(
                      "file_entries must hold shards 0 to ", manifest.num_shards - 1,
                      " of save ", save_id, " once each, got shard ", f.shard_index, " file ",
                      f.name)));
      stems.push_back(f.name.substr(0, f.name.size() - suffix.size()));
      keep.insert(f.name);
    }

    tensorflow::Env* env = SaveEnv(sync_);
    const std::string path = JoinPath(dir, prefix + kManifestSuffix);
    // The generation this one replaces: its files go once the new one is in.
    Manifest old;
    bool have_old = false;
    if (env->FileExists(path).ok()) {
      std::string text;
      have_old = tensorflow::ReadFileToString(env, path, &text).ok() &&
                 ParseManifest(text, &old).ok();
    }
    // The data files' directory entries first, then the manifest, aside,
    // synced, renamed: a crash before the rename leaves the old manifest,
    // after it the new one, never a manifest naming files a crash lost.
    if (sync_) OP_REQUIRES_OK(ctx, SyncDirectory(dir));
    const std::string tmp = path + ".tmp-" + save_id;
    OP_REQUIRES_OK(ctx, WriteManifestFile(env, tmp, SerializeManifest(manifest), sync_));
    OP_REQUIRES_OK(ctx, env->RenameFile(tmp, path));
    if (sync_) OP_REQUIRES_OK(ctx, SyncDirectory(dir));

    std::set<std::string> old_files;
    if (have_old) {
      for (const ManifestFile& f : old.files) old_files.insert(f.name);
    }
    DeleteOwned(env, dir, [&](const std::string& name) {
      if (keep.count(name) > 0) return false;
      return old_files.count(name) > 0 || NamesOwnedBy(name, prefix, stems);
    });
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tensorflow::tstring>()() = save_id;
  }

 private:
  Manifest manifest_;
  bool sync_ = true;
};

// ---------------------------------------------------------------------------
// Load
// ---------------------------------------------------------------------------

// Streams read together with one set of LoadOptions: a generation's files,
// a version 1 set, or files saved on their own.
struct FileGroup {
  std::vector<std::unique_ptr<FileSource>> files;
  LoadOptions options;
  // The save ids this group reports: the generation's, "" for a version 1
  // set; files on their own report each file's (read from its header).
  std::vector<std::string> save_ids;
  bool ids_from_files = false;
  uint64_t rows = 0;  // the manifest's count of the rows read (an estimate when filtered)

  std::vector<ByteSource*> sources() const {
    std::vector<ByteSource*> out;
    for (const auto& f : files) out.push_back(f.get());
    return out;
  }
};

// What DynembTableStageLoad hands DynembTableCommitLoad.
class StagedLoad : public tensorflow::ResourceBase {
 public:
  // `groups`: the files an in-place commit reads again (none with a staged
  // table, which holds everything the commit needs).
  StagedLoad(const TableResource* target, std::unique_ptr<Table> table,
             std::vector<FileGroup> groups, bool clear_first)
      : target_(target), table_(std::move(table)), groups_(std::move(groups)),
        clear_first_(clear_first) {}

  std::string DebugString() const override {
    return table_ != nullptr ? "DynembStagedLoad(staged)" : "DynembStagedLoad(in place)";
  }

  absl::Status Commit(OpKernelContext* ctx, TableResource* resource) {
    absl::MutexLock lock(&mu_);
    if (resource != target_) {
      return absl::InvalidArgumentError(
          "staged must come from DynembTableStageLoad of the same table");
    }
    if (committed_) return absl::FailedPreconditionError("this staged load was committed already");
    committed_ = true;
    if (table_ != nullptr) {
      resource->ReplaceTable(std::move(table_));
      return absl::OkStatus();
    }
    // In place: the files were checked by the stage; read them again into
    // the table.
    std::unique_ptr<Runner> runner;
    TF_RETURN_IF_ERROR(resource->NewRunner(ctx, &runner));
    const TableResource::TableUse use(*resource);
    for (size_t i = 0; i < groups_.size(); ++i) {
      FileGroup& g = groups_[i];
      LoadOptions options = g.options;
      options.validate_first = false;
      options.clear_first = clear_first_ && i == 0;
      const std::vector<ByteSource*> sources = g.sources();
      for (ByteSource* source : sources) TF_RETURN_IF_ERROR(ToTfStatus(source->Rewind()));
      const Status s = resource->LoadFiles(sources, options, *runner);
      if (!s.ok()) {
        return absl::Status(
            static_cast<absl::StatusCode>(s.code()),
            absl::StrCat(s.message(), " (every file had been checked before the table changed, "
                                      "so the storage failed under the load or memory ran out; "
                                      "the table now holds part of the files' rows: load again)"));
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Mutex mu_;
  const TableResource* const target_;
  std::unique_ptr<Table> table_ ABSL_GUARDED_BY(mu_);
  std::vector<FileGroup> groups_ ABSL_GUARDED_BY(mu_);
  const bool clear_first_;
  bool committed_ ABSL_GUARDED_BY(mu_) = false;
};

// (`-NNNNN-of-NNNNN.dynemb`).
bool ParseV1Tail(const std::string& path, int32_t* index, int32_t* num_shards) {
  const std::string base(tensorflow::io::Basename(path));
  const size_t cut = base.size() >= 22 ? base.size() - 22 : std::string::npos;
  return cut != std::string::npos && ParseV1ShardFileName(base, base.substr(0, cut), index, num_shards);
}

}  // namespace

StageLoadOp::StageLoadOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
  int64_t num_shards = 1, shard_index = 0;
  std::string partitioner;
  OP_REQUIRES_OK(ctx, ctx->GetAttr("chunk_rows", &chunk_rows_));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("num_shards", &num_shards));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("shard_index", &shard_index));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("partitioner", &partitioner));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("clear_first", &clear_first_));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("in_place", &in_place_));
  OP_REQUIRES_OK(ctx, ctx->GetAttr("files_are_fallback", &files_are_fallback_));
  OP_REQUIRES(ctx, num_shards <= INT32_MAX && shard_index < num_shards,
              absl::InvalidArgumentError(absl::StrCat(
                  "shard_index must be in [0, num_shards), got shard_index ", shard_index,
                  ", num_shards ", num_shards)));
  num_shards_ = static_cast<int32_t>(num_shards);
  shard_index_ = static_cast<int32_t>(shard_index);
  custom_partitioner_ = partitioner == "custom";
}

void StageLoadOp::Compute(OpKernelContext* ctx) {
  tensorflow::core::RefCountPtr<TableResource> resource;
  OP_REQUIRES_OK(ctx,
                 tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, 0), &resource));
  const Tensor& manifests_t = ctx->input(1);
  const Tensor& files_t = ctx->input(2);
  OP_REQUIRES(ctx, manifests_t.dims() == 1 && files_t.dims() <= 1,
              absl::InvalidArgumentError(absl::StrCat(
                  "manifest_paths must be a vector and filepaths a vector or a scalar, got "
                  "shapes ",
                  manifests_t.shape().DebugString(), " and ", files_t.shape().DebugString())));
  std::string expected_save_id;
  OP_REQUIRES_OK(ctx, ScalarInput(ctx, 3, "expected_save_id", &expected_save_id));
  const auto manifest_paths = manifests_t.flat<tensorflow::tstring>();
  const auto filepaths = files_t.flat<tensorflow::tstring>();
  const TableOptions& opt = resource->options();
  tensorflow::Env* env = CheckpointEnv();

  LoadOptions base;
  base.chunk_rows = chunk_rows_;
  base.validate_first = false;
  base.clear_first = false;
  // How shard shard_index_ of num_shards_ reads `saved_shards` files whose
  // keys `saved_custom` (or an unknown partitioner: version 1) routed; sets
  // *only_own_file when it reads file shard_index_ alone.
  const auto plan = [&](int32_t saved_shards, bool saved_custom, bool saved_known,
                        const std::string& what, LoadOptions* options,
                        bool* only_own_file) -> absl::Status {
    *options = base;
    *only_own_file = false;
    if (num_shards_ == 1) return absl::OkStatus();  // every key is this shard's
    if (saved_shards == num_shards_ && (!saved_known || saved_custom == custom_partitioner_)) {
      *only_own_file = true;
      if (!custom_partitioner_) {  // each key must be in the file of its shard
        options->num_shards = num_shards_;
        options->shard_index = shard_index_;
        options->verify_routing = true;
      }
      return absl::OkStatus();
    }
    if (!custom_partitioner_ && (!saved_known || !saved_custom)) {
      options->num_shards = num_shards_;
      options->shard_index = shard_index_;
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat(
        what, " holds ", saved_shards, " shard(s) routed by ",
        saved_known ? (saved_custom ? "a custom partitioner" : "de.default_partition_fn")
                    : "an unknown partitioner",
        ", and this variable has ", num_shards_, " shards routed by ",
        custom_partitioner_ ? "a custom partitioner" : "de.default_partition_fn",
        ": files load into another number of shards only when both use "
        "de.default_partition_fn, and keys routed by one partitioner do not load into shards "
        "routed by another (restore through tf.train.Checkpoint, which routes every key)"));
  };

  std::vector<FileGroup> groups;
  // Generations.
  for (int64_t m = 0; m < manifest_paths.size(); ++m) {
    const std::string path(manifest_paths(m));
    const absl::Status exists = env->FileExists(path);
    if (absl::IsNotFound(exists)) {
      OP_REQUIRES(ctx, files_are_fallback_,
                  absl::NotFoundError(absl::StrCat(path, ": no such manifest")));
      continue;
    }
    OP_REQUIRES_OK(ctx, exists);
    std::string text;
    OP_REQUIRES_OK(ctx, tensorflow::ReadFileToString(env, path, &text));
    Manifest manifest;
    const Status parsed = ParseManifest(text, &manifest);
    OP_REQUIRES(ctx, parsed.ok(),
                absl::Status(static_cast<absl::StatusCode>(parsed.code()),
                             absl::StrCat(path, ": ", parsed.message())));
    OP_REQUIRES(ctx,
                manifest.key_type == opt.key_type && manifest.value_type == opt.value_type &&
                    manifest.dim == opt.dim,
                absl::InvalidArgumentError(absl::StrCat(
                    path, ": the save has ",
                    Describe(manifest.key_type, manifest.value_type, manifest.dim),
                    " but the table has ", Describe(opt.key_type, opt.value_type, opt.dim))));
    OP_REQUIRES(ctx, expected_save_id.empty() || manifest.save_id == expected_save_id,
                absl::FailedPreconditionError(absl::StrCat(
                    path, ": the files are save ", manifest.save_id, ", but save ",
                    expected_save_id,
                    " was asked for (a checkpoint names the save written with it): a later "
                    "save replaced its files")));
    FileGroup group;
    bool only_own = false;
    OP_REQUIRES_OK(ctx, plan(manifest.num_shards, manifest.partitioner == "custom", true, path,
                             &group.options, &only_own));
    const std::string dir(tensorflow::io::Dirname(path));
    for (const ManifestFile& f : manifest.files) {
      if (only_own && f.shard_index != shard_index_) continue;
      group.options.expected.push_back(ExpectedFile{manifest.save_id, f.shard_index,
                                                    manifest.num_shards, f.rows, f.bytes,
                                                    f.digest});
      std::unique_ptr<FileSource> source;
      OP_REQUIRES_OK(ctx, OpenFile(JoinPath(dir, f.name), &group.options.expected.back(), &source));
      group.files.push_back(std::move(source));
      group.rows += only_own || num_shards_ == 1 ? f.rows : f.rows / num_shards_;
    }
    group.save_ids = {manifest.save_id};
    groups.push_back(std::move(group));
  }
  // Files: a version 1 set when no generation was found, or files on their own.
  if (!files_are_fallback_ || groups.empty()) {
    std::vector<std::string> paths;
    for (int64_t i = 0; i < filepaths.size(); ++i) paths.emplace_back(filepaths(i));
    if (files_are_fallback_) {
      // A version 1 set: <prefix>-NNNNN-of-NNNNN.dynemb, one of each index
      // (a pattern in a graph also matches generation files: those are skipped).
      std::vector<std::string> v1;
      for (const std::string& p : paths) {
        int32_t index, n;
        if (ParseV1Tail(p, &index, &n)) v1.push_back(p);
      }
      paths.swap(v1);
    }
    if (files_are_fallback_ && !paths.empty()) {
      OP_REQUIRES(ctx, expected_save_id.empty(),
                  absl::FailedPreconditionError(absl::StrCat(
                      "save ", expected_save_id, " was asked for, but there is no manifest, only "
                      "version 1 files (which have no save id): ", paths[0])));
      std::vector<std::string> by_index;
      int32_t saved_shards = -1;
      for (const std::string& p : paths) {
        int32_t index, n;
        ParseV1Tail(p, &index, &n);
        OP_REQUIRES(ctx, (saved_shards < 0 || n == saved_shards) && index < n,
                    absl::InvalidArgumentError(absl::StrCat(
                        "an incomplete or mixed set of version 1 shard files: ", p)));
        saved_shards = n;
        by_index.resize(n);
        OP_REQUIRES(ctx, by_index[index].empty(),
                    absl::InvalidArgumentError(absl::StrCat(
                        "an incomplete or mixed set of version 1 shard files: ", p)));
        by_index[index] = p;
      }
      OP_REQUIRES(ctx, static_cast<int32_t>(paths.size()) == saved_shards,
                  absl::InvalidArgumentError(absl::StrCat(
                      "an incomplete or mixed set of version 1 shard files: ", paths.size(),
                      " files of ", saved_shards, " shards, the first ", paths[0])));
      FileGroup group;
      bool only_own = false;
      OP_REQUIRES_OK(ctx, plan(saved_shards, false, false,
                               absl::StrCat("the version 1 save ", paths[0]), &group.options,
                               &only_own));
      for (int32_t i = 0; i < saved_shards; ++i) {
        if (only_own && i != shard_index_) continue;
        std::unique_ptr<FileSource> source;
        OP_REQUIRES_OK(ctx, OpenFile(by_index[i], nullptr, &source));
        group.files.push_back(std::move(source));
      }
      group.save_ids = {""};
      groups.push_back(std::move(group));
    } else if (!paths.empty()) {
      OP_REQUIRES(ctx, num_shards_ == 1 || !custom_partitioner_,
                  absl::InvalidArgumentError(absl::StrCat(
                      "files saved on their own load into ", num_shards_,
                      " shards routed by de.default_partition_fn only; this variable uses a "
                      "custom partitioner")));
      FileGroup group;
      group.options = base;
      group.options.num_shards = num_shards_;
      group.options.shard_index = shard_index_;
      group.ids_from_files = true;
      for (const std::string& p : paths) {
        std::unique_ptr<FileSource> source;
        OP_REQUIRES_OK(ctx, OpenFile(p, nullptr, &source));
        group.files.push_back(std::move(source));
      }
      groups.push_back(std::move(group));
    }
  }
  // No file is an error, not an empty table (a directory matched in a graph
  // may hold no files).
  OP_REQUIRES(ctx, !groups.empty(),
              absl::NotFoundError(absl::StrCat(
                  "no table files to load: no manifest among ", manifests_t.DebugString(),
                  " and no files among ", files_t.DebugString())));

  std::unique_ptr<Runner> runner;
  OP_REQUIRES_OK(ctx, resource->NewRunner(ctx, &runner));
  std::unique_ptr<Table> staged;
  if (clear_first_ && !in_place_) {
    uint64_t rows = 0;
    for (const FileGroup& g : groups) rows += g.rows;
    const absl::Status made = resource->NewStagingTable(static_cast<int64_t>(rows), &staged);
    if (!absl::IsUnimplemented(made)) OP_REQUIRES_OK(ctx, made);
  }
  const auto with_hint = [](const Status& s) {
    if (s.code() != StatusCode::kResourceExhausted) return ToTfStatus(s);
    return absl::ResourceExhaustedError(absl::StrCat(
        s.message(), " (a load holds the table's old and new content at once until it is "
                     "complete; in_place=True needs memory for one of them)"));
  };
  std::vector<std::string> save_ids;
  for (FileGroup& g : groups) {
    std::vector<LoadedFile> loaded;
    if (staged != nullptr) {
      OP_REQUIRES_OK(ctx, with_hint(LoadTable(g.sources(), *staged, g.options, *runner, &loaded)));
    } else {
      OP_REQUIRES_OK(ctx, ToTfStatus(CheckTableFiles(g.sources(), opt, g.options, &loaded)));
    }
    if (g.ids_from_files) {
      for (const LoadedFile& f : loaded) save_ids.push_back(f.save_id);
    } else {
      save_ids.insert(save_ids.end(), g.save_ids.begin(), g.save_ids.end());
    }
  }

  Tensor* handle;
  tensorflow::AllocatorAttributes host;
  host.set_on_host(true);
  OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &handle, host));
  // A staged table holds all the commit needs: its files can close now.
  if (staged != nullptr) groups.clear();
  handle->scalar<tensorflow::ResourceHandle>()() =
      tensorflow::ResourceHandle::MakeRefCountingHandle(
          new StagedLoad(resource.get(), std::move(staged), std::move(groups), clear_first_),
          ctx->device()->name());
  Tensor* ids;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({static_cast<int64_t>(save_ids.size())}),
                                           &ids, host));
  for (size_t i = 0; i < save_ids.size(); ++i) ids->flat<tensorflow::tstring>()(i) = save_ids[i];
}

void CommitLoadOp::Compute(OpKernelContext* ctx) {
  tensorflow::core::RefCountPtr<TableResource> resource;
  OP_REQUIRES_OK(ctx,
                 tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, 0), &resource));
  tensorflow::core::RefCountPtr<StagedLoad> staged;
  OP_REQUIRES_OK(ctx,
                 tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, 1), &staged));
  OP_REQUIRES_OK(ctx, staged->Commit(ctx, resource.get()));
}

#define DYNEMB_REGISTER_CPU(name, kernel) \
  REGISTER_KERNEL_BUILDER(Name(name).Device(tensorflow::DEVICE_CPU), kernel)

DYNEMB_REGISTER_CPU("DynembNewSaveId", NewSaveIdOp);
DYNEMB_REGISTER_CPU("DynembWriteManifest", WriteManifestOp);
DYNEMB_REGISTER_CPU("DynembTableSaveToFile", SaveToFileOp);
DYNEMB_REGISTER_CPU("DynembTableStageLoad", StageLoadOp);
DYNEMB_REGISTER_CPU("DynembTableCommitLoad", CommitLoadOp);

#undef DYNEMB_REGISTER_CPU

}  // namespace dynemb
