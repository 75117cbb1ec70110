#include "cc/core/table_io.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/partition.h"

namespace dynemb {
namespace {

constexpr char kMagic[8] = {'D', 'Y', 'N', 'E', 'M', 'B', '\0', '\1'};
constexpr uint32_t kVersion = 1;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t key_type;
  uint32_t value_type;
  uint32_t reserved;
  int64_t dim;
};
static_assert(sizeof(Header) == 32, "header layout");

size_t NumericKeyBytes(KeyType type) { return type == KeyType::kInt32 ? 4 : 8; }

std::string Describe(KeyType key, ValueType value, int64_t dim) {
  return std::string("key type ") + KeyTypeName(key) + ", value type " + ValueTypeName(value) +
         ", dim " + std::to_string(dim);
}

template <typename T>
void AppendPod(std::vector<char>* buf, const T& v) {
  const char* p = reinterpret_cast<const char*>(&v);
  buf->insert(buf->end(), p, p + sizeof(T));
}

Status ReadExact(ByteSource* source, void* data, size_t size, const char* what) {
  bool eof = false;
  DYNEMB_RETURN_IF_ERROR(source->Read(data, size, &eof));
  if (eof) {
    return Status(StatusCode::kDataLoss,
                  std::string("table file ended early while reading ") + what);
  }
  return Status::Ok();
}

}  // namespace

Status SaveTable(Table& table, int64_t chunk_rows, ByteSink* sink) {
  const TableOptions& opt = table.options();
  Header header{};
  std::memcpy(header.magic, kMagic, 8);
  header.version = kVersion;
  header.key_type = static_cast<uint32_t>(opt.key_type);
  header.value_type = static_cast<uint32_t>(opt.value_type);
  header.dim = opt.dim;
  DYNEMB_RETURN_IF_ERROR(sink->Append(&header, sizeof(header)));

  const size_t value_bytes = opt.value_bytes();
  const bool string_keys = opt.key_type == KeyType::kString;
  const size_t key_bytes = string_keys ? 0 : NumericKeyBytes(opt.key_type);
  uint64_t total = 0;
  std::vector<char> buf;
  DYNEMB_RETURN_IF_ERROR(table.ExportChunks(
      chunk_rows, [&](const void* keys, int64_t n, const void* values, const uint64_t* scores) {
        buf.clear();
        AppendPod(&buf, static_cast<uint64_t>(n));
        for (int64_t i = 0; i < n; ++i) {
          if (string_keys) {
            std::string_view key = static_cast<const std::string_view*>(keys)[i];
            AppendPod(&buf, static_cast<uint32_t>(key.size()));
            buf.insert(buf.end(), key.begin(), key.end());
          } else {
            const char* k = static_cast<const char*>(keys) + i * key_bytes;
            buf.insert(buf.end(), k, k + key_bytes);
          }
          AppendPod(&buf, scores[i]);
          const char* v = static_cast<const char*>(values) + i * value_bytes;
          buf.insert(buf.end(), v, v + value_bytes);
        }
        total += static_cast<uint64_t>(n);
        return sink->Append(buf.data(), buf.size());
      }));
  const uint64_t footer[2] = {0, total};
  DYNEMB_RETURN_IF_ERROR(sink->Append(footer, sizeof(footer)));
  return sink->Close();
}

namespace {

// Reads the header and checks it against the table.
Status ReadHeader(ByteSource* source, const TableOptions& opt) {
  Header header{};
  DYNEMB_RETURN_IF_ERROR(ReadExact(source, &header, sizeof(header), "the header"));
  if (std::memcmp(header.magic, kMagic, 8) != 0) {
    return Status(StatusCode::kDataLoss, "not a tensorflow_dynemb table file (bad magic)");
  }
  if (header.version != kVersion) {
    return Status(StatusCode::kFailedPrecondition,
                  "table file format version " + std::to_string(header.version) +
                      " is not supported (expected " + std::to_string(kVersion) + ")");
  }
  const auto file_key = static_cast<KeyType>(header.key_type);
  const auto file_value = static_cast<ValueType>(header.value_type);
  if (file_key != opt.key_type || file_value != opt.value_type || header.dim != opt.dim) {
    return InvalidArgument("table file has " + Describe(file_key, file_value, header.dim) +
                           " but the table has " +
                           Describe(opt.key_type, opt.value_type, opt.dim));
  }
  return Status::Ok();
}

// Reads a string key of `len` bytes in pieces, so that a damaged length
// field costs at most the bytes the stream really has, not a 4 GiB allocation.
Status ReadStringKey(ByteSource* source, uint32_t len, std::string* key) {
  constexpr uint32_t kPiece = 1 << 16;
  key->clear();
  for (uint32_t got = 0; got < len;) {
    const uint32_t step = std::min(len - got, kPiece);
    key->resize(got + step);
    DYNEMB_RETURN_IF_ERROR(ReadExact(source, &(*key)[got], step, "a key"));
    got += step;
  }
  return Status::Ok();
}

// The most bytes of rows a load reads before inserting them.
constexpr uint64_t kMaxBatchBytes = uint64_t{64} << 20;

// One batch of rows read from a stream, in the layout Table::Insert takes.
struct RowBatch {
  std::vector<char> numeric_keys;
  std::vector<std::string> string_keys;
  std::vector<std::string_view> string_views;
  std::vector<char> values;
  std::vector<uint64_t> scores;

  // Keeps only the rows of shard `index` of `num_shards`, in order.
  // Returns the number kept.
  uint64_t KeepShard(const TableOptions& opt, uint64_t n, int32_t num_shards, int32_t index) {
    const size_t value_bytes = opt.value_bytes();
    uint64_t kept = 0;
    for (uint64_t i = 0; i < n; ++i) {
      int32_t shard;
      if (opt.key_type == KeyType::kString) {
        shard = ShardOfKey(std::string_view(string_keys[i]), num_shards);
      } else if (opt.key_type == KeyType::kInt32) {
        int32_t k;
        std::memcpy(&k, numeric_keys.data() + i * 4, 4);
        shard = ShardOfKey(k, num_shards);
      } else {
        int64_t k;
        std::memcpy(&k, numeric_keys.data() + i * 8, 8);
        shard = ShardOfKey(k, num_shards);
      }
      if (shard != index) continue;
      if (kept != i) {
        if (opt.key_type == KeyType::kString) {
          string_keys[kept].swap(string_keys[i]);
        } else {
          const size_t kb = NumericKeyBytes(opt.key_type);
          std::memcpy(numeric_keys.data() + kept * kb, numeric_keys.data() + i * kb, kb);
        }
        std::memcpy(values.data() + kept * value_bytes, values.data() + i * value_bytes,
                    value_bytes);
        scores[kept] = scores[i];
      }
      ++kept;
    }
    return kept;
  }

  const void* keys(const TableOptions& opt, uint64_t n) {
    if (opt.key_type != KeyType::kString) return numeric_keys.data();
    string_views.assign(string_keys.begin(), string_keys.begin() + n);
    return string_views.data();
  }
};

// Reads the records after the header in batches of at most chunk_rows rows,
// inserting each batch (filtered to one shard when asked) into `table`, or,
// with table == nullptr, only checking that the stream is complete and well
// formed.
Status ReadRecords(ByteSource* source, const TableOptions& opt, const LoadOptions& load,
                   Table* table, const Runner& runner) {
  const size_t value_bytes = opt.value_bytes();
  const bool string_keys = opt.key_type == KeyType::kString;
  const size_t key_bytes = string_keys ? 0 : NumericKeyBytes(opt.key_type);
  RowBatch rows;
  uint64_t total = 0;
  for (;;) {
    uint64_t n = 0;
    DYNEMB_RETURN_IF_ERROR(ReadExact(source, &n, sizeof(n), "a record size"));
    if (n == 0) break;
    // A record's size comes from the file: a damaged one may claim any
    // number of rows, so a batch is also capped in bytes (the reads then
    // reach the end of the file and say so).
    const uint64_t max_batch =
        std::min<uint64_t>(static_cast<uint64_t>(load.chunk_rows),
                           std::max<uint64_t>(1, kMaxBatchBytes / (key_bytes + sizeof(uint64_t) +
                                                                   value_bytes)));
    for (uint64_t done = 0; done < n;) {
      const uint64_t batch = std::min<uint64_t>(n - done, max_batch);
      try {
        rows.numeric_keys.resize(batch * key_bytes);
        rows.string_keys.resize(string_keys ? batch : 0);
        rows.values.resize(batch * value_bytes);
        rows.scores.resize(batch);
      } catch (const std::bad_alloc&) {
        return Status(StatusCode::kResourceExhausted,
                      "out of memory for a batch of " + std::to_string(batch) +
                          " rows read from the table file; pass a smaller chunk_rows");
      }
      for (uint64_t i = 0; i < batch; ++i) {
        if (string_keys) {
          uint32_t len = 0;
          DYNEMB_RETURN_IF_ERROR(ReadExact(source, &len, sizeof(len), "a key length"));
          DYNEMB_RETURN_IF_ERROR(ReadStringKey(source, len, &rows.string_keys[i]));
        } else {
          DYNEMB_RETURN_IF_ERROR(
              ReadExact(source, rows.numeric_keys.data() + i * key_bytes, key_bytes, "a key"));
        }
        DYNEMB_RETURN_IF_ERROR(ReadExact(source, &rows.scores[i], sizeof(uint64_t), "a score"));
        DYNEMB_RETURN_IF_ERROR(
            ReadExact(source, rows.values.data() + i * value_bytes, value_bytes, "a value row"));
      }
      if (table != nullptr) {
        const uint64_t kept = load.num_shards > 1
                                  ? rows.KeepShard(opt, batch, load.num_shards, load.shard_index)
                                  : batch;
        DYNEMB_RETURN_IF_ERROR(table->Insert(rows.keys(opt, kept), static_cast<int64_t>(kept),
                                             rows.values.data(), rows.scores.data(), runner));
      }
      done += batch;
      total += batch;
    }
  }
  uint64_t expected_total = 0;
  DYNEMB_RETURN_IF_ERROR(ReadExact(source, &expected_total, sizeof(expected_total), "the footer"));
  if (expected_total != total) {
    return Status(StatusCode::kDataLoss, "table file footer says " +
                                             std::to_string(expected_total) + " rows, read " +
                                             std::to_string(total));
  }
  return Status::Ok();
}

}  // namespace

namespace {

// `status`, prefixed with the name of the stream it is about.
Status Named(const ByteSource& source, Status status) {
  if (status.ok() || source.Name().empty()) return status;
  return Status(status.code(), source.Name() + ": " + status.message());
}

Status ValidateStream(ByteSource* source, const TableOptions& opt, const LoadOptions& options,
                      const Runner& runner) {
  DYNEMB_RETURN_IF_ERROR(ReadHeader(source, opt));
  DYNEMB_RETURN_IF_ERROR(ReadRecords(source, opt, options, nullptr, runner));
  return source->Rewind();
}

Status LoadStream(ByteSource* source, Table& table, const LoadOptions& options,
                  const Runner& runner) {
  DYNEMB_RETURN_IF_ERROR(ReadHeader(source, table.options()));
  return ReadRecords(source, table.options(), options, &table, runner);
}

}  // namespace

Status LoadTable(const std::vector<ByteSource*>& sources, Table& table,
                 const LoadOptions& options, const Runner& runner) {
  if (options.chunk_rows < 1) {
    return InvalidArgument("chunk_rows must be >= 1, got " + std::to_string(options.chunk_rows));
  }
  if (options.num_shards < 1 || options.shard_index < 0 ||
      options.shard_index >= options.num_shards) {
    return InvalidArgument("shard_index must be in [0, num_shards), got shard_index " +
                           std::to_string(options.shard_index) + ", num_shards " +
                           std::to_string(options.num_shards));
  }
  if (options.clear_first) {
    // A damaged file must not cost the table its content: read every stream
    // through once before clearing (reading is far cheaper than inserting).
    for (ByteSource* source : sources) {
      DYNEMB_RETURN_IF_ERROR(
          Named(*source, ValidateStream(source, table.options(), options, runner)));
    }
    table.Clear();
  }
  for (ByteSource* source : sources) {
    DYNEMB_RETURN_IF_ERROR(Named(*source, LoadStream(source, table, options, runner)));
  }
  return Status::Ok();
}

}  // namespace dynemb
