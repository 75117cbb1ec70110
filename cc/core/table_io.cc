#include "cc/core/table_io.h"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/crc32c.h"
#include "cc/core/out_of_memory.h"
#include "cc/core/partition.h"

namespace dynemb {
namespace {

// Why a save or a read failed when memory ran out. Made once, when the
// library loads, so that returning them allocates nothing (out_of_memory.h).
const Status kWriteOutOfMemory(
    StatusCode::kResourceExhausted,
    "out of memory while writing a table file; free memory, or save with a smaller chunk_rows");
const Status kReadOutOfMemory(
    StatusCode::kResourceExhausted,
    "out of memory while reading a table file; free memory, or load with a smaller chunk_rows");

// kResourceExhausted with the message describe() builds, or kReadOutOfMemory
// when building it runs out of memory too.
template <typename Describe>
Status OutOfMemory(Describe&& describe) {
  try {
    return Status(StatusCode::kResourceExhausted, describe());
  } catch (const std::bad_alloc&) {
    return kReadOutOfMemory;
  }
}

constexpr char kMagic[8] = {'D', 'Y', 'N', 'E', 'M', 'B', '\0', '\1'};

// The 32 bytes versions 1 and 2 share (version 1's whole header).
struct HeaderStart {
  char magic[8];
  uint32_t version;
  uint32_t key_type;
  uint32_t value_type;
  uint32_t flags;  // version 1: reserved (0)
  int64_t dim;
};
static_assert(sizeof(HeaderStart) == 32, "header layout");

// The rest of a version 2 header.
struct HeaderRest {
  char save_id[kSaveIdChars];
  int32_t shard_index;
  int32_t num_shards;
  uint32_t reserved;
  uint32_t crc;  // masked, of the 60 bytes before
};
static_assert(sizeof(HeaderRest) == 32, "header layout");

struct BlockHead {
  uint64_t rows;
  uint64_t payload_bytes;
  uint32_t payload_crc;  // masked
  uint32_t head_crc;     // masked, of the 20 bytes before
};
static_assert(sizeof(BlockHead) == 24, "block head layout");
constexpr size_t kHeadCrcBytes = offsetof(BlockHead, head_crc);
constexpr size_t kFooterPayloadBytes = 16;

// A block's payload is cut at about this many bytes (a single row may make
// it larger): what a reader must hold at once, whatever chunk_rows the
// writer used.
constexpr size_t kBlockBytes = size_t{8} << 20;

size_t NumericKeyBytes(KeyType type) { return type == KeyType::kInt32 ? 4 : 8; }

std::string Describe(KeyType key, ValueType value, int64_t dim) {
  return std::string("key type ") + KeyTypeName(key) + ", value type " + ValueTypeName(value) +
         ", dim " + std::to_string(dim);
}

template <typename T>
void PutPod(char* at, const T& v) {
  std::memcpy(at, &v, sizeof(T));
}

std::string Hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

// ---------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------

// Appends blocks to a sink, keeping the byte count and the digest.
class BlockWriter {
 public:
  explicit BlockWriter(ByteSink* sink) : sink_(sink) {}

  Status Header(const TableOptions& opt, const SaveOptions& save) {
    char bytes[sizeof(HeaderStart) + sizeof(HeaderRest)] = {};
    HeaderStart start{};
    std::memcpy(start.magic, kMagic, 8);
    start.flags = (save.routed ? kRoutedFlag : 0) | (save.with_scores ? 0 : kNoScoresFlag) |
                  (save.keys_only ? kKeysOnlyFlag : 0);
    // Version 2 readers do not know the row layouts of version 3: only files
    // that use them say 3, so that older builds still read every other file.
    start.version = (start.flags & kVersion3Flags) != 0 ? kTableFileVersion : 2;
    start.key_type = static_cast<uint32_t>(opt.key_type);
    start.value_type = static_cast<uint32_t>(opt.value_type);
    start.dim = opt.dim;
    HeaderRest rest{};
    std::memset(rest.save_id, '0', kSaveIdChars);
    std::memcpy(rest.save_id, save.save_id.data(), std::min(save.save_id.size(), kSaveIdChars));
    rest.shard_index = save.shard_index;
    rest.num_shards = save.num_shards;
    std::memcpy(bytes, &start, sizeof(start));
    std::memcpy(bytes + sizeof(start), &rest, sizeof(rest));
    const uint32_t crc = MaskCrc32c(Crc32c(bytes, sizeof(bytes) - 4));
    PutPod(bytes + sizeof(bytes) - 4, crc);
    digest_ = Crc32cExtend(digest_, bytes, sizeof(bytes));
    return Append(bytes, sizeof(bytes));
  }

  Status Block(uint64_t rows, const char* payload, size_t size) {
    BlockHead head{rows, size, MaskCrc32c(Crc32c(payload, size)), 0};
    head.head_crc = MaskCrc32c(Crc32c(&head, kHeadCrcBytes));
    if (rows > 0) digest_ = Crc32cExtend(digest_, &head, sizeof(head));
    DYNEMB_RETURN_IF_ERROR(Append(&head, sizeof(head)));
    return Append(payload, size);
  }

  Status Footer(uint64_t total_rows) {
    char payload[kFooterPayloadBytes] = {};
    PutPod(payload, total_rows);
    PutPod(payload + 8, digest_);
    return Block(0, payload, sizeof(payload));
  }

  uint64_t bytes() const { return bytes_; }
  uint32_t digest() const { return digest_; }

 private:
  Status Append(const void* data, size_t size) {
    bytes_ += size;
    return sink_->Append(data, size);
  }

  ByteSink* const sink_;
  uint64_t bytes_ = 0;
  uint32_t digest_ = 0;
};

// Writes one file's header, its rows in blocks, then its footer (the row
// layout follows the options: key | score | values, key | values, or key).
class RowFileWriter {
 public:
  RowFileWriter(const TableOptions& opt, const SaveOptions& options, ByteSink* sink)
      : opt_(opt), options_(options), sink_(sink), writer_(sink),
        value_bytes_(options.keys_only ? 0 : opt.value_bytes()),
        score_bytes_(options.keys_only || !options.with_scores ? 0 : sizeof(uint64_t)),
        string_keys_(opt.key_type == KeyType::kString),
        key_bytes_(string_keys_ ? 0 : NumericKeyBytes(opt.key_type)),
        block_rows_(static_cast<uint64_t>(options.chunk_rows)) {}

  Status Begin() {
    if (options_.chunk_rows < 1) {
      return InvalidArgument("chunk_rows must be >= 1, got " + std::to_string(options_.chunk_rows));
    }
    if (options_.save_id.size() > kSaveIdChars) {
      return InvalidArgument("save_id must have at most " + std::to_string(kSaveIdChars) +
                             " characters, got '" + options_.save_id + "'");
    }
    return writer_.Header(opt_, options_);
  }

  // Adds n rows (`values` and `scores` are ignored where the layout has none).
  // Rows gather into one block until it holds chunk_rows rows or about
  // kBlockBytes (ExportChunks hands over one shard's rows at a time, which in
  // a small table are a few rows each: a block per chunk would cost its
  // 24-byte head per few rows).
  Status Add(const void* keys, int64_t n, const void* values, const uint64_t* scores) {
    const char* v = static_cast<const char*>(values);
    for (int64_t i = 0; i < n;) {
      if (!string_keys_) {
        // Rows [i, end) in one copy loop: as many as the block takes.
        const size_t row_bytes = key_bytes_ + score_bytes_ + value_bytes_;
        const uint64_t by_bytes =
            buf_.size() < kBlockBytes ? (kBlockBytes - buf_.size() + row_bytes - 1) / row_bytes : 1;
        const uint64_t room = std::min(block_rows_ - rows_in_block_, std::max<uint64_t>(1, by_bytes));
        const int64_t end = std::min<int64_t>(n, i + static_cast<int64_t>(room));
        const size_t at = buf_.size();
        buf_.resize(at + static_cast<size_t>(end - i) * row_bytes);
        char* out = buf_.data() + at;
        const char* k = static_cast<const char*>(keys);
        for (int64_t r = i; r < end; ++r) {
          std::memcpy(out, k + r * key_bytes_, key_bytes_);
          if (score_bytes_ > 0) std::memcpy(out + key_bytes_, &scores[r], score_bytes_);
          if (value_bytes_ > 0) {
            std::memcpy(out + key_bytes_ + score_bytes_, v + r * value_bytes_, value_bytes_);
          }
          out += row_bytes;
        }
        rows_in_block_ += static_cast<uint64_t>(end - i);
        i = end;
      } else {
        const std::string_view key = static_cast<const std::string_view*>(keys)[i];
        const size_t at = buf_.size();
        buf_.resize(at + sizeof(uint32_t) + key.size() + score_bytes_ + value_bytes_);
        char* out = buf_.data() + at;
        PutPod(out, static_cast<uint32_t>(key.size()));
        std::memcpy(out + 4, key.data(), key.size());
        if (score_bytes_ > 0) std::memcpy(out + 4 + key.size(), &scores[i], score_bytes_);
        if (value_bytes_ > 0) {
          std::memcpy(out + 4 + key.size() + score_bytes_, v + i * value_bytes_, value_bytes_);
        }
        ++rows_in_block_;
        ++i;
      }
      if (rows_in_block_ >= block_rows_ || buf_.size() >= kBlockBytes) {
        DYNEMB_RETURN_IF_ERROR(Flush());
      }
    }
    return Status::Ok();
  }

  // The last block, the footer; closes the sink.
  Status Finish(SavedFile* saved) {
    DYNEMB_RETURN_IF_ERROR(Flush());
    DYNEMB_RETURN_IF_ERROR(writer_.Footer(total_));
    DYNEMB_RETURN_IF_ERROR(sink_->Close());
    if (saved != nullptr) *saved = SavedFile{total_, writer_.bytes(), writer_.digest()};
    return Status::Ok();
  }

 private:
  Status Flush() {
    if (rows_in_block_ == 0) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(writer_.Block(rows_in_block_, buf_.data(), buf_.size()));
    total_ += rows_in_block_;
    rows_in_block_ = 0;
    buf_.clear();
    return Status::Ok();
  }

  const TableOptions& opt_;
  const SaveOptions& options_;
  ByteSink* const sink_;
  BlockWriter writer_;
  const size_t value_bytes_;
  const size_t score_bytes_;
  const bool string_keys_;
  const size_t key_bytes_;
  const uint64_t block_rows_;
  uint64_t total_ = 0;
  uint64_t rows_in_block_ = 0;
  std::vector<char> buf_;
};

Status CheckLayout(const SaveOptions& options) {
  if (options.keys_only && options.with_scores) {
    return InvalidArgument("a keys_only file has no scores: pass with_scores false");
  }
  return Status::Ok();
}

}  // namespace

Status SaveTable(Table& table, const SaveOptions& options, ByteSink* sink, SavedFile* saved) {
  DYNEMB_RETURN_IF_ERROR(CheckLayout(options));
  if (options.keys_only) return InvalidArgument("SaveTable writes rows: keys_only must be false");
  return CatchOutOfMemory(kWriteOutOfMemory, [&] {
    RowFileWriter writer(table.options(), options, sink);
    DYNEMB_RETURN_IF_ERROR(writer.Begin());
    DYNEMB_RETURN_IF_ERROR(table.ExportChunks(
        options.chunk_rows,
        [&](const void* keys, int64_t n, const void* values, const uint64_t* scores) {
          return writer.Add(keys, n, values, scores);
        }));
    return writer.Finish(saved);
  });
}

Status SaveChanges(Table& table, const ChangeMark& since, const ChangeMark& until,
                   const SaveOptions& options, ByteSink* rows, ByteSink* removed,
                   SavedFile* rows_saved, SavedFile* removed_saved, bool* complete) {
  *complete = false;
  SaveOptions row_options = options;
  row_options.with_scores = false;
  row_options.keys_only = false;
  SaveOptions key_options = row_options;
  key_options.keys_only = true;
  return CatchOutOfMemory(kWriteOutOfMemory, [&] {
    RowFileWriter row_writer(table.options(), row_options, rows);
    RowFileWriter key_writer(table.options(), key_options, removed);
    DYNEMB_RETURN_IF_ERROR(row_writer.Begin());
    DYNEMB_RETURN_IF_ERROR(key_writer.Begin());
    DYNEMB_RETURN_IF_ERROR(table.ExportChanges(
        since, until, options.chunk_rows,
        [&](const void* keys, int64_t n, const void* values, const uint64_t*) {
          return row_writer.Add(keys, n, values, nullptr);
        },
        [&](const void* keys, int64_t n) { return key_writer.Add(keys, n, nullptr, nullptr); },
        complete));
    if (!*complete) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(row_writer.Finish(rows_saved));
    return key_writer.Finish(removed_saved);
  });
}

Status SaveRows(const TableOptions& table, const SaveOptions& options, const void* keys,
                int64_t n, const void* values, const uint64_t* scores, ByteSink* sink,
                SavedFile* saved) {
  DYNEMB_RETURN_IF_ERROR(CheckLayout(options));
  if (options.with_scores && scores == nullptr && n > 0) {
    return InvalidArgument("SaveRows: scores must not be null when with_scores is true");
  }
  return CatchOutOfMemory(kWriteOutOfMemory, [&] {
    RowFileWriter writer(table, options, sink);
    DYNEMB_RETURN_IF_ERROR(writer.Begin());
    DYNEMB_RETURN_IF_ERROR(writer.Add(keys, n, values, scores));
    return writer.Finish(saved);
  });
}

Status SaveTable(Table& table, int64_t chunk_rows, ByteSink* sink) {
  SaveOptions options;
  options.chunk_rows = chunk_rows;
  return SaveTable(table, options, sink, nullptr);
}

namespace {

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

// A source read from its start, counting bytes, so errors can say where.
class Reader {
 public:
  explicit Reader(ByteSource* source) : source_(source) {}

  uint64_t offset() const { return offset_; }

  Status Exact(void* data, size_t size, const char* what) {
    bool eof = false;
    const Status s = source_->Read(data, size, &eof);
    if (!s.ok()) {
      if (s.code() != StatusCode::kDataLoss) return s;
      return Status(StatusCode::kDataLoss, "the file ends inside " + std::string(what) +
                                               " at byte " + std::to_string(offset_));
    }
    if (eof) {
      return Status(StatusCode::kDataLoss, "the file ends early, at byte " +
                                               std::to_string(offset_) + ", before " + what);
    }
    offset_ += size;
    return Status::Ok();
  }

  // Whether the source has no byte left (a byte that is there is damage).
  Status AtEnd() {
    char byte;
    bool eof = false;
    const Status s = source_->Read(&byte, 1, &eof);
    if (!s.ok() && s.code() != StatusCode::kDataLoss) return s;
    if (s.ok() && eof) return Status::Ok();
    return Status(StatusCode::kDataLoss,
                  "bytes follow the footer at byte " + std::to_string(offset_));
  }

 private:
  ByteSource* const source_;
  uint64_t offset_ = 0;
};

// Reads a string key of `len` bytes in pieces, so that a damaged length
// field costs at most the bytes the stream really has, not a 4 GiB allocation.
Status ReadStringKey(Reader* reader, uint32_t len, std::string* key) {
  constexpr uint32_t kPiece = 1 << 16;
  key->clear();
  for (uint32_t got = 0; got < len;) {
    const uint32_t step = std::min(len - got, kPiece);
    key->resize(got + step);
    DYNEMB_RETURN_IF_ERROR(reader->Exact(&(*key)[got], step, "a key"));
    got += step;
  }
  return Status::Ok();
}

// The most bytes of rows a version 1 load reads before inserting them.
constexpr uint64_t kMaxBatchBytes = uint64_t{64} << 20;

// One batch of rows read from a stream, in the layout Table::Insert takes.
struct RowBatch {
  std::vector<char> numeric_keys;
  std::vector<std::string> string_keys;
  std::vector<std::string_view> string_views;
  std::vector<char> values;
  std::vector<uint64_t> scores;

  Status Resize(const TableOptions& opt, uint64_t n) {
    const bool strings = opt.key_type == KeyType::kString;
    try {
      numeric_keys.resize(strings ? 0 : n * NumericKeyBytes(opt.key_type));
      string_keys.resize(strings ? n : 0);
      values.resize(n * opt.value_bytes());
      scores.resize(n);
    } catch (const std::bad_alloc&) {
      return OutOfMemory([&] {
        return "out of memory for a batch of " + std::to_string(n) +
               " rows read from the table file; pass a smaller chunk_rows";
      });
    }
    return Status::Ok();
  }

  int32_t ShardOf(const TableOptions& opt, uint64_t i, int32_t num_shards) const {
    if (opt.key_type == KeyType::kString) {
      return ShardOfKey(std::string_view(string_keys[i]), num_shards);
    }
    if (opt.key_type == KeyType::kInt32) {
      int32_t k;
      std::memcpy(&k, numeric_keys.data() + i * 4, 4);
      return ShardOfKey(k, num_shards);
    }
    int64_t k;
    std::memcpy(&k, numeric_keys.data() + i * 8, 8);
    return ShardOfKey(k, num_shards);
  }

  // Moves row i to row `to` (< i).
  void MoveRow(const TableOptions& opt, uint64_t i, uint64_t to) {
    const size_t value_bytes = opt.value_bytes();
    if (opt.key_type == KeyType::kString) {
      string_keys[to].swap(string_keys[i]);
    } else {
      const size_t kb = NumericKeyBytes(opt.key_type);
      std::memcpy(numeric_keys.data() + to * kb, numeric_keys.data() + i * kb, kb);
    }
    std::memcpy(values.data() + to * value_bytes, values.data() + i * value_bytes, value_bytes);
    scores[to] = scores[i];
  }

  const void* keys(const TableOptions& opt, uint64_t n) {
    if (opt.key_type != KeyType::kString) return numeric_keys.data();
    string_views.assign(string_keys.begin(), string_keys.begin() + n);
    return string_views.data();
  }
};

// One stream being read: its options, what is expected of it, and where
// its rows go (table == nullptr: only checked).
struct StreamJob {
  const TableOptions* opt;
  const LoadOptions* load;
  const ExpectedFile* expected;  // nullable
  Table* table;                  // nullable
  const Runner* runner;
  LoadedFile info;
};

// Hands rows [0, n) of `rows` to the table, filtered or checked by shard.
Status Deliver(StreamJob* job, RowBatch* rows, uint64_t n, uint64_t first_row_offset) {
  const TableOptions& opt = *job->opt;
  const LoadOptions& load = *job->load;
  uint64_t kept = n;
  if (load.num_shards > 1) {
    kept = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const int32_t shard = rows->ShardOf(opt, i, load.num_shards);
      if (shard != load.shard_index) {
        if (load.verify_routing) {
          return Status(StatusCode::kDataLoss,
                        "the file holds a key that belongs to shard " + std::to_string(shard) +
                            " of " + std::to_string(load.num_shards) + ", not to shard " +
                            std::to_string(load.shard_index) +
                            " (in the block at byte " + std::to_string(first_row_offset) +
                            "): shard files were swapped, or saved with another partitioner");
        }
        continue;
      }
      if (kept != i) rows->MoveRow(opt, i, kept);
      ++kept;
    }
  }
  if (kept == 0) return Status::Ok();
  const bool removal = (job->info.flags & kKeysOnlyFlag) != 0;
  const bool scores = !removal && (job->info.flags & kNoScoresFlag) == 0;
  const void* keys = rows->keys(opt, kept);
  if (load.consumer) {
    return load.consumer(keys, static_cast<int64_t>(kept), removal ? nullptr : rows->values.data(),
                         scores ? rows->scores.data() : nullptr, removal);
  }
  if (job->table == nullptr) return Status::Ok();
  if (removal) return job->table->Remove(keys, static_cast<int64_t>(kept), *job->runner);
  // A file without scores: the table scores the rows as an insert does.
  return job->table->Insert(keys, static_cast<int64_t>(kept), rows->values.data(),
                            scores ? rows->scores.data() : nullptr, *job->runner);
}

Status CheckExpected(const std::string& what, uint64_t have, uint64_t want) {
  if (have == want) return Status::Ok();
  return Status(StatusCode::kDataLoss, "the file's " + what + " is " + std::to_string(have) +
                                           ", the manifest says " + std::to_string(want));
}

// Version 2: blocks, each checked before its rows are used.
Status ReadBlocks(Reader* reader, uint32_t digest, StreamJob* job) {
  const TableOptions& opt = *job->opt;
  // The row layout: key | score | values, key | values (kNoScoresFlag) or key
  // (kKeysOnlyFlag).
  const bool keys_only = (job->info.flags & kKeysOnlyFlag) != 0;
  const size_t score_bytes =
      keys_only || (job->info.flags & kNoScoresFlag) != 0 ? 0 : sizeof(uint64_t);
  const size_t value_bytes = keys_only ? 0 : opt.value_bytes();
  const bool string_keys = opt.key_type == KeyType::kString;
  const size_t key_bytes = string_keys ? 0 : NumericKeyBytes(opt.key_type);
  const uint64_t chunk = static_cast<uint64_t>(job->load->chunk_rows);
  std::vector<char> payload;
  RowBatch rows;
  uint64_t total = 0;
  for (;;) {
    const uint64_t at = reader->offset();
    BlockHead head{};
    DYNEMB_RETURN_IF_ERROR(reader->Exact(&head, sizeof(head), "a block head"));
    if (UnmaskCrc32c(head.head_crc) != Crc32c(&head, kHeadCrcBytes)) {
      return Status(StatusCode::kDataLoss,
                    "checksum mismatch in the block head at byte " + std::to_string(at));
    }
    const bool footer = head.rows == 0;
    // A head that checks out was written by SaveTable; still, a payload
    // must hold its rows' fixed bytes, which bounds what a head can ask for.
    const uint64_t min_row = (string_keys ? 4 : key_bytes) + score_bytes + value_bytes;
    if (footer ? head.payload_bytes != kFooterPayloadBytes
               : head.payload_bytes / min_row < head.rows) {
      return Status(StatusCode::kDataLoss, "the block at byte " + std::to_string(at) +
                                               " claims " + std::to_string(head.rows) +
                                               " rows in " + std::to_string(head.payload_bytes) +
                                               " bytes");
    }
    try {
      payload.resize(head.payload_bytes);
    } catch (const std::bad_alloc&) {
      return OutOfMemory([&] {
        return "out of memory for a block of " + std::to_string(head.payload_bytes) +
               " bytes of the table file";
      });
    }
    DYNEMB_RETURN_IF_ERROR(reader->Exact(payload.data(), payload.size(), "a block"));
    if (UnmaskCrc32c(head.payload_crc) != Crc32c(payload.data(), payload.size())) {
      return Status(StatusCode::kDataLoss,
                    "checksum mismatch in the block at byte " + std::to_string(at));
    }
    if (footer) {
      uint64_t footer_rows;
      uint32_t footer_digest;
      std::memcpy(&footer_rows, payload.data(), 8);
      std::memcpy(&footer_digest, payload.data() + 8, 4);
      if (footer_rows != total || footer_digest != digest) {
        return Status(StatusCode::kDataLoss,
                      "the footer says " + std::to_string(footer_rows) + " rows, digest " +
                          Hex32(footer_digest) + "; read " + std::to_string(total) +
                          " rows, digest " + Hex32(digest) + " (blocks are missing or moved)");
      }
      DYNEMB_RETURN_IF_ERROR(reader->AtEnd());
      job->info.rows = total;
      if (job->expected != nullptr) {
        DYNEMB_RETURN_IF_ERROR(CheckExpected("row count", total, job->expected->rows));
        DYNEMB_RETURN_IF_ERROR(CheckExpected("size in bytes", reader->offset(),
                                             job->expected->bytes));
        if (digest != job->expected->digest) {
          return Status(StatusCode::kDataLoss, "the file's digest is " + Hex32(digest) +
                                                   ", the manifest says " +
                                                   Hex32(job->expected->digest));
        }
      }
      return Status::Ok();
    }
    digest = Crc32cExtend(digest, &head, sizeof(head));
    // The rows, parsed in batches of at most chunk_rows.
    const char* p = payload.data();
    const char* const end = p + payload.size();
    const auto damaged = [&] {
      return Status(StatusCode::kDataLoss, "the block at byte " + std::to_string(at) +
                                               " does not hold the rows it claims");
    };
    for (uint64_t done = 0; done < head.rows;) {
      const uint64_t batch = std::min(head.rows - done, chunk);
      DYNEMB_RETURN_IF_ERROR(rows.Resize(opt, batch));
      for (uint64_t i = 0; i < batch; ++i) {
        if (string_keys) {
          uint32_t len;
          if (end - p < 4) return damaged();
          std::memcpy(&len, p, 4);
          p += 4;
          if (static_cast<uint64_t>(end - p) < len) return damaged();
          rows.string_keys[i].assign(p, len);
          p += len;
        } else {
          if (static_cast<size_t>(end - p) < key_bytes) return damaged();
          std::memcpy(rows.numeric_keys.data() + i * key_bytes, p, key_bytes);
          p += key_bytes;
        }
        if (static_cast<size_t>(end - p) < score_bytes + value_bytes) return damaged();
        rows.scores[i] = 0;
        std::memcpy(&rows.scores[i], p, score_bytes);
        p += score_bytes;
        if (value_bytes > 0) std::memcpy(rows.values.data() + i * value_bytes, p, value_bytes);
        p += value_bytes;
      }
      DYNEMB_RETURN_IF_ERROR(Deliver(job, &rows, batch, at));
      done += batch;
    }
    if (p != end) return damaged();
    total += head.rows;
  }
}

// Version 1: records without checksums, then a footer with the row count.
Status ReadRecordsV1(Reader* reader, StreamJob* job) {
  const TableOptions& opt = *job->opt;
  const size_t value_bytes = opt.value_bytes();
  const bool string_keys = opt.key_type == KeyType::kString;
  const size_t key_bytes = string_keys ? 0 : NumericKeyBytes(opt.key_type);
  RowBatch rows;
  uint64_t total = 0;
  for (;;) {
    const uint64_t at = reader->offset();
    uint64_t n = 0;
    DYNEMB_RETURN_IF_ERROR(reader->Exact(&n, sizeof(n), "a record size"));
    if (n == 0) break;
    // A record's size comes from the file: a damaged one may claim any
    // number of rows, so a batch is also capped in bytes (the reads then
    // reach the end of the file and say so).
    const uint64_t max_batch = std::min<uint64_t>(
        static_cast<uint64_t>(job->load->chunk_rows),
        std::max<uint64_t>(1, kMaxBatchBytes / (key_bytes + sizeof(uint64_t) + value_bytes)));
    for (uint64_t done = 0; done < n;) {
      const uint64_t batch = std::min<uint64_t>(n - done, max_batch);
      DYNEMB_RETURN_IF_ERROR(rows.Resize(opt, batch));
      for (uint64_t i = 0; i < batch; ++i) {
        if (string_keys) {
          uint32_t len = 0;
          DYNEMB_RETURN_IF_ERROR(reader->Exact(&len, sizeof(len), "a key length"));
          DYNEMB_RETURN_IF_ERROR(ReadStringKey(reader, len, &rows.string_keys[i]));
        } else {
          DYNEMB_RETURN_IF_ERROR(
              reader->Exact(rows.numeric_keys.data() + i * key_bytes, key_bytes, "a key"));
        }
        DYNEMB_RETURN_IF_ERROR(reader->Exact(&rows.scores[i], sizeof(uint64_t), "a score"));
        DYNEMB_RETURN_IF_ERROR(
            reader->Exact(rows.values.data() + i * value_bytes, value_bytes, "a value row"));
      }
      DYNEMB_RETURN_IF_ERROR(Deliver(job, &rows, batch, at));
      done += batch;
      total += batch;
    }
  }
  uint64_t expected_total = 0;
  DYNEMB_RETURN_IF_ERROR(reader->Exact(&expected_total, sizeof(expected_total), "the footer"));
  if (expected_total != total) {
    return Status(StatusCode::kDataLoss, "the footer says " + std::to_string(expected_total) +
                                             " rows, read " + std::to_string(total));
  }
  job->info.rows = total;
  return Status::Ok();
}

// Reads one stream from its start: header, then rows.
Status ReadStream(ByteSource* source, StreamJob* job) {
  const TableOptions& opt = *job->opt;
  Reader reader(source);
  HeaderStart start{};
  DYNEMB_RETURN_IF_ERROR(reader.Exact(&start, sizeof(start), "the end of the header"));
  if (std::memcmp(start.magic, kMagic, 8) != 0) {
    return Status(StatusCode::kDataLoss, "not a tensorflow_dynemb table file (bad magic)");
  }
  if (start.version < kOldestTableFileVersion || start.version > kTableFileVersion) {
    return Status(StatusCode::kFailedPrecondition,
                  "table file format version " + std::to_string(start.version) +
                      " is not supported: this tensorflow_dynemb reads versions " +
                      std::to_string(kOldestTableFileVersion) + " to " +
                      std::to_string(kTableFileVersion) +
                      (start.version > kTableFileVersion
                           ? " (the file was written by a newer tensorflow_dynemb)"
                           : ""));
  }
  job->info.version = start.version;
  uint32_t digest = 0;
  if (start.version >= 2) {
    HeaderRest rest{};
    DYNEMB_RETURN_IF_ERROR(reader.Exact(&rest, sizeof(rest), "the end of the header"));
    char bytes[sizeof(start) + sizeof(rest)];
    std::memcpy(bytes, &start, sizeof(start));
    std::memcpy(bytes + sizeof(start), &rest, sizeof(rest));
    if (UnmaskCrc32c(rest.crc) != Crc32c(bytes, sizeof(bytes) - 4)) {
      return Status(StatusCode::kDataLoss, "checksum mismatch in the header (byte 0)");
    }
    digest = Crc32c(bytes, sizeof(bytes));
    job->info.save_id.assign(rest.save_id, kSaveIdChars);
    job->info.shard_index = rest.shard_index;
    job->info.num_shards = rest.num_shards;
    job->info.routed = (start.flags & kRoutedFlag) != 0;
    job->info.flags = start.flags;
    const uint32_t known = kRoutedFlag | (start.version >= 3 ? kVersion3Flags : 0);
    if ((start.flags & ~known) != 0 ||
        ((start.flags & kKeysOnlyFlag) != 0 && (start.flags & kNoScoresFlag) == 0)) {
      return Status(StatusCode::kDataLoss, "flags " + std::to_string(start.flags) +
                                               " in the header are not valid for format version " +
                                               std::to_string(start.version));
    }
  } else if (job->expected != nullptr) {
    return Status(StatusCode::kDataLoss,
                  "a version 1 file where the manifest names a version 2 file");
  }
  const auto file_key = static_cast<KeyType>(start.key_type);
  const auto file_value = static_cast<ValueType>(start.value_type);
  if (file_key != opt.key_type || file_value != opt.value_type || start.dim != opt.dim) {
    return InvalidArgument("table file has " + Describe(file_key, file_value, start.dim) +
                           " but the table has " + Describe(opt.key_type, opt.value_type, opt.dim));
  }
  if (const ExpectedFile* want = job->expected) {
    if (job->info.save_id != want->save_id) {
      return Status(StatusCode::kDataLoss,
                    "the file belongs to save " + job->info.save_id + ", the manifest to save " +
                        want->save_id + " (a file of another save was put in its place)");
    }
    if (job->info.shard_index != want->shard_index || job->info.num_shards != want->num_shards) {
      return Status(StatusCode::kDataLoss,
                    "the file holds shard " + std::to_string(job->info.shard_index) + " of " +
                        std::to_string(job->info.num_shards) + ", the manifest lists it as shard " +
                        std::to_string(want->shard_index) + " of " +
                        std::to_string(want->num_shards) + " (files were swapped or renamed)");
    }
  }
  if (start.version >= 2) return ReadBlocks(&reader, digest, job);
  return ReadRecordsV1(&reader, job);
}

// `status`, prefixed with the name of the stream it is about (as it is, when
// memory has run out for the longer message).
Status Named(const ByteSource& source, Status status) {
  if (status.ok()) return status;
  try {
    const std::string name = source.Name();
    if (name.empty()) return status;
    return Status(status.code(), name + ": " + status.message());
  } catch (const std::bad_alloc&) {
    return status;
  }
}

Status CheckLoadOptions(const std::vector<ByteSource*>& sources, const LoadOptions& options) {
  if (options.chunk_rows < 1) {
    return InvalidArgument("chunk_rows must be >= 1, got " + std::to_string(options.chunk_rows));
  }
  if (options.num_shards < 1 || options.shard_index < 0 ||
      options.shard_index >= options.num_shards) {
    return InvalidArgument("shard_index must be in [0, num_shards), got shard_index " +
                           std::to_string(options.shard_index) + ", num_shards " +
                           std::to_string(options.num_shards));
  }
  if (!options.expected.empty() && options.expected.size() != sources.size()) {
    return InvalidArgument("expected must be empty or hold one entry per stream, got " +
                           std::to_string(options.expected.size()) + " for " +
                           std::to_string(sources.size()) + " streams");
  }
  return Status::Ok();
}

// Reads sources[i] into `table` (nullptr: only checks it).
Status ReadOne(const std::vector<ByteSource*>& sources, size_t i, const TableOptions& opt,
               const LoadOptions& options, Table* table, const Runner& runner,
               std::vector<LoadedFile>* loaded) {
  StreamJob job{&opt, &options, options.expected.empty() ? nullptr : &options.expected[i], table,
                &runner, LoadedFile{}};
  // The reads allocate as they go (a block's payload, a batch's rows, each
  // string key): wherever memory runs out, the load returns an error.
  DYNEMB_RETURN_IF_ERROR(Named(
      *sources[i], CatchOutOfMemory(kReadOutOfMemory, [&] { return ReadStream(sources[i], &job); })));
  if (loaded != nullptr) (*loaded)[i] = job.info;
  return Status::Ok();
}

}  // namespace

Status CheckTableFiles(const std::vector<ByteSource*>& sources, const TableOptions& table,
                       const LoadOptions& options, std::vector<LoadedFile>* loaded) {
  DYNEMB_RETURN_IF_ERROR(CheckLoadOptions(sources, options));
  if (loaded != nullptr) loaded->assign(sources.size(), LoadedFile{});
  const SerialRunner runner;
  for (size_t i = 0; i < sources.size(); ++i) {
    DYNEMB_RETURN_IF_ERROR(ReadOne(sources, i, table, options, nullptr, runner, loaded));
    DYNEMB_RETURN_IF_ERROR(Named(*sources[i], sources[i]->Rewind()));
  }
  return Status::Ok();
}

Status LoadTable(const std::vector<ByteSource*>& sources, Table& table,
                 const LoadOptions& options, const Runner& runner,
                 std::vector<LoadedFile>* loaded) {
  DYNEMB_RETURN_IF_ERROR(CheckLoadOptions(sources, options));
  if (options.validate_first) {
    // A damaged file must not cost the table its content: read every stream
    // through once before changing anything (reading is far cheaper than
    // inserting).
    DYNEMB_RETURN_IF_ERROR(CheckTableFiles(sources, table.options(), options, nullptr));
  }
  if (options.clear_first) DYNEMB_RETURN_IF_ERROR(table.CheckedClear());
  if (loaded != nullptr) loaded->assign(sources.size(), LoadedFile{});
  for (size_t i = 0; i < sources.size(); ++i) {
    DYNEMB_RETURN_IF_ERROR(ReadOne(sources, i, table.options(), options, &table, runner, loaded));
  }
  return Status::Ok();
}

}  // namespace dynemb
