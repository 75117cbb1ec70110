// File helpers shared by the file kernels (file_kernels.cc: table files and
// generations) and the delta kernels (delta_kernels.cc: online learning):
// byte sinks and sources over TF's file systems, the directory sync, manifest
// writes and the manifest's file entries.

#ifndef DYNEMB_KERNELS_FILE_IO_H_
#define DYNEMB_KERNELS_FILE_IO_H_

#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "cc/core/generation.h"
#include "cc/core/table.h"
#include "cc/core/table_io.h"
#include "cc/kernels/direct_io.h"
#include "cc/kernels/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/file_system.h"

namespace dynemb {

// Files are read, and written when synced, through CheckpointEnv
// (direct_io.h): local files with direct I/O, like checkpoints. Besides
// sparing the page cache, it makes the sync each file gets cheap: on the VM
// measured (docs/benchmarks.md) buffered writes synced ran at ~220 MB/s,
// direct writes at ~1.5 GB/s.

// A file being written; with `sync`, Close flushes it and syncs it to the
// storage, so a manifest written after it never names bytes that a crash of
// the machine can lose.
class WritableFileSink : public ByteSink {
 public:
  WritableFileSink(std::unique_ptr<tensorflow::WritableFile> file, bool sync)
      : file_(std::move(file)), sync_(sync) {}
  Status Append(const void* data, size_t size) override {
    return FromTfStatus(file_->Append(absl::string_view(static_cast<const char*>(data), size)));
  }
  Status Close() override {
    absl::Status s = sync_ ? file_->Sync() : absl::OkStatus();
    if (s.ok()) s = file_->Close();
    return FromTfStatus(s);
  }

 private:
  std::unique_ptr<tensorflow::WritableFile> file_;
  const bool sync_;
};


// A file read in order, in chunks, with the next chunk read ahead by a
// helper thread while the caller parses and inserts the current one: a
// load then costs about what the slower of the two takes, not their sum
// (direct reads come from the disk, not from the cache).
class FileSource : public ByteSource {
 public:
  FileSource(std::unique_ptr<tensorflow::RandomAccessFile> file, std::string path)
      : file_(std::move(file)), path_(std::move(path)) {}
  ~FileSource() override { WaitAhead(); }

  std::string Name() const override { return path_; }

  Status Rewind() override {
    WaitAhead();
    next_offset_ = 0;
    pos_ = len_ = 0;
    at_end_ = false;
    return Status::Ok();
  }

  Status Read(void* data, size_t size, bool* eof) override {
    *eof = false;
    char* out = static_cast<char*>(data);
    size_t done = 0;
    while (done < size) {
      if (pos_ == len_) {
        if (at_end_) return Short(done, size, eof);
        DYNEMB_RETURN_IF_ERROR(Advance());
        if (len_ == 0) return Short(done, size, eof);
      }
      const size_t step = std::min(size - done, len_ - pos_);
      std::memcpy(out + done, current_.data() + pos_, step);
      pos_ += step;
      done += step;
    }
    return Status::Ok();
  }

 private:
  static constexpr size_t kChunkBytes = size_t{8} << 20;

  // Reads up to n bytes at `offset` into `to`; *got receives how many.
  Status ReadAt(uint64_t offset, size_t n, char* to, size_t* got) const {
    absl::string_view result;
    // The (offset, n, result, scratch) form: TF 2.16 has no other; newer TFs
    // mark it deprecated but still route every read through it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    const absl::Status s = file_->Read(offset, n, &result, to);
#pragma GCC diagnostic pop
    if (!s.ok() && !absl::IsOutOfRange(s)) return FromTfStatus(s);
    if (result.data() != to && !result.empty()) std::memmove(to, result.data(), result.size());
    *got = result.size();
    return Status::Ok();
  }

  // Starts reading the chunk at next_offset_ into ahead_buffer_.
  void StartAhead() {
    if (ahead_buffer_.size() != kChunkBytes) ahead_buffer_.resize(kChunkBytes);
    const uint64_t offset = next_offset_;
    next_offset_ += kChunkBytes;
    auto read = [this, offset] {
      size_t got = 0;
      const Status s = ReadAt(offset, kChunkBytes, ahead_buffer_.data(), &got);
      return std::make_pair(s, got);
    };
    try {
      ahead_ = std::async(std::launch::async, read);
    } catch (const std::system_error&) {  // no thread to be had: read now
      std::promise<std::pair<Status, size_t>> now;
      now.set_value(read());
      ahead_ = now.get_future();
    }
  }

  void WaitAhead() {
    if (ahead_.valid()) ahead_.wait();
    ahead_ = {};
  }

  // Makes the chunk read ahead current, and starts reading the next one.
  Status Advance() {
    if (!ahead_.valid()) StartAhead();
    const std::pair<Status, size_t> read = ahead_.get();
    DYNEMB_RETURN_IF_ERROR(read.first);
    current_.swap(ahead_buffer_);
    pos_ = 0;
    len_ = read.second;
    at_end_ = len_ < kChunkBytes;
    if (!at_end_) StartAhead();
    return Status::Ok();
  }

  // The end came after `done` of `size` bytes: the end of the stream when
  // nothing was read, else a truncation. The buffers go: a load may hold
  // many read files open (a resharding shard reads every file of a save).
  Status Short(size_t done, size_t size, bool* eof) {
    std::vector<char>().swap(current_);
    std::vector<char>().swap(ahead_buffer_);
    pos_ = len_ = 0;
    if (done == 0) {
      *eof = true;
      return Status::Ok();
    }
    return Status(StatusCode::kDataLoss, "read " + std::to_string(done) + " of " +
                                             std::to_string(size) + " bytes");
  }

  std::unique_ptr<tensorflow::RandomAccessFile> file_;
  std::string path_;
  std::vector<char> current_;       // bytes [0, len_) of the chunk being read
  std::vector<char> ahead_buffer_;  // the next chunk, filled by ahead_
  std::future<std::pair<Status, size_t>> ahead_;
  uint64_t next_offset_ = 0;  // the file offset of the next chunk to read ahead
  size_t pos_ = 0, len_ = 0;
  bool at_end_ = false;
};

// Where a save writes: synced saves through CheckpointEnv (direct I/O, whose
// writes are on the disk when they return, so the sync is cheap); unsynced
// ones through the page cache, which returns before the disk has the bytes.
tensorflow::Env* SaveEnv(bool sync);

std::string JoinPath(const std::string& dir, const std::string& name);

// Makes the directory's entries (a rename, a new file) durable, on local
// file systems: TF's Env has no call for it. Object stores have no
// directories to sync, and their writes are durable once closed.
absl::Status SyncDirectory(const std::string& dir);

// Writes `text` to `path` (synced with `sync`).
absl::Status WriteManifestFile(tensorflow::Env* env, const std::string& path,
                               const std::string& text, bool sync);

// Deletes the children of `dir` that `owned` names, best effort: the save it
// follows is complete, and a name left behind is deleted by the next save.
void DeleteOwned(tensorflow::Env* env, const std::string& dir,
                 const std::function<bool(const std::string&)>& owned);

// The attrs chunk_rows, shard_index, num_shards and routed of an op that writes
// one shard's file, into *options (shard_index checked against num_shards).
absl::Status GetShardFileAttrs(tensorflow::OpKernelConstruction* ctx, SaveOptions* options);

// The string of scalar input `index`, named `what` in errors.
absl::Status ScalarInput(tensorflow::OpKernelContext* ctx, int index, const char* what,
                         std::string* out);

// InvalidArgument unless `id` is a save id (generation.h).
absl::Status CheckSaveId(const std::string& id);

// InvalidArgument unless `name` is a plain file name (no '/').
absl::Status CheckFileName(const std::string& name, const char* what);

// The manifest line of a saved file: "shard name bytes rows digest".
std::string FileEntry(int32_t shard, const std::string& name, const SavedFile& saved);

// Parses FileEntry's text.
absl::Status ParseFileEntry(const std::string& entry, ManifestFile* file);

// "key type ..., value type ..., dim ..." for errors.
std::string Describe(KeyType key, ValueType value, int64_t dim);

// Opens `path` for reading; with `expected` (a manifest's record of it), a
// missing file is NotFound and a file of another size DataLoss, both naming it.
absl::Status OpenFile(const std::string& path, const ExpectedFile* expected,
                      std::unique_ptr<FileSource>* out);

}  // namespace dynemb

#endif  // DYNEMB_KERNELS_FILE_IO_H_
