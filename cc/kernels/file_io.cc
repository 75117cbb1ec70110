// File helpers shared by the file and delta kernels (file_io.h).

#include "cc/kernels/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/lib/io/path.h"

namespace dynemb {

using ::tensorflow::OpKernelContext;

tensorflow::Env* SaveEnv(bool sync) { return sync ? CheckpointEnv() : tensorflow::Env::Default(); }

std::string JoinPath(const std::string& dir, const std::string& name) {
  return tensorflow::io::JoinPath(dir, name);
}

absl::Status SyncDirectory(const std::string& dir) {
  absl::string_view scheme, host, path;
  tensorflow::io::ParseURI(dir, &scheme, &host, &path);
  if (!scheme.empty() && scheme != "file") return absl::OkStatus();
  const std::string local(path.empty() ? "." : path);
  const int fd = ::open(local.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::OkStatus();  // not a local directory after all
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL && err != EROFS) {
    return absl::InternalError(
        absl::StrCat("could not sync the directory ", dir, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::Status WriteManifestFile(tensorflow::Env* env, const std::string& path,
                               const std::string& text, bool sync) {
  std::unique_ptr<tensorflow::WritableFile> file;
  TF_RETURN_IF_ERROR(env->NewWritableFile(path, &file));
  TF_RETURN_IF_ERROR(file->Append(text));
  if (sync) TF_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

void DeleteOwned(tensorflow::Env* env, const std::string& dir,
                 const std::function<bool(const std::string&)>& owned) {
  std::vector<std::string> children;
  if (!env->GetChildren(dir, &children).ok()) return;
  for (const std::string& name : children) {
    if (owned(name)) env->DeleteFile(JoinPath(dir, name)).IgnoreError();
  }
}

absl::Status GetShardFileAttrs(tensorflow::OpKernelConstruction* ctx, SaveOptions* options) {
  int64_t shard_index = 0, num_shards = 1;
  TF_RETURN_IF_ERROR(ctx->GetAttr("chunk_rows", &options->chunk_rows));
  TF_RETURN_IF_ERROR(ctx->GetAttr("shard_index", &shard_index));
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_shards", &num_shards));
  TF_RETURN_IF_ERROR(ctx->GetAttr("routed", &options->routed));
  if (num_shards > INT32_MAX || shard_index >= num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard_index must be in [0, num_shards), got shard_index ", shard_index,
        ", num_shards ", num_shards));
  }
  options->shard_index = static_cast<int32_t>(shard_index);
  options->num_shards = static_cast<int32_t>(num_shards);
  return absl::OkStatus();
}

absl::Status ScalarInput(OpKernelContext* ctx, int index, const char* what, std::string* out) {
  return ScalarString(ctx->input(index), what, out);
}

absl::Status CheckSaveId(const std::string& id) {
  if (IsSaveId(id)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("save_id must be ", kSaveIdChars,
                                                 " lowercase hex characters, got '", id, "'"));
}

absl::Status CheckFileName(const std::string& name, const char* what) {
  if (!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..") {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be a file name (no '/'), got '", name, "'"));
}

std::string FileEntry(int32_t shard, const std::string& name, const SavedFile& saved) {
  char tail[64];
  std::snprintf(tail, sizeof(tail), " %" PRIu64 " %" PRIu64 " %08x", saved.bytes, saved.rows,
                saved.digest);
  return std::to_string(shard) + " " + name + tail;
}

absl::Status ParseFileEntry(const std::string& entry, ManifestFile* file) {
  char name[4096];
  unsigned long long bytes = 0, rows = 0;
  unsigned int digest = 0;
  char tail = 0;
  if (entry.size() >= sizeof(name) ||
      std::sscanf(entry.c_str(), "%d %4095s %llu %llu %8x%c", &file->shard_index, name, &bytes,
                  &rows, &digest, &tail) != 5) {
    return absl::InvalidArgumentError(absl::StrCat(
        "file_entries must be DynembTableSaveToFile's outputs, got '", entry, "'"));
  }
  file->name = name;
  file->bytes = bytes;
  file->rows = rows;
  file->digest = digest;
  return absl::OkStatus();
}

std::string Describe(KeyType key, ValueType value, int64_t dim) {
  return absl::StrCat("key type ", KeyTypeName(key), ", value type ", ValueTypeName(value),
                      ", dim ", dim);
}

absl::Status OpenFile(const std::string& path, const ExpectedFile* expected,
                      std::unique_ptr<FileSource>* out) {
  tensorflow::Env* env = CheckpointEnv();
  if (expected != nullptr) {
    uint64_t size = 0;
    const absl::Status s = env->GetFileSize(path, &size);
    if (absl::IsNotFound(s)) {
      return absl::NotFoundError(absl::StrCat(
          path, ": the manifest names this file but it is missing (a save replaced the "
                "generation during the load, or the file was deleted)"));
    }
    TF_RETURN_IF_ERROR(s);
    if (size != expected->bytes) {
      return absl::DataLossError(absl::StrCat(path, ": the file has ", size,
                                              " bytes, the manifest says ", expected->bytes));
    }
  }
  std::unique_ptr<tensorflow::RandomAccessFile> file;
  TF_RETURN_IF_ERROR(env->NewRandomAccessFile(path, &file));
  *out = std::make_unique<FileSource>(std::move(file), path);
  return absl::OkStatus();
}

// The index and shard count a version 1 shard file's name ends with

}  // namespace dynemb
