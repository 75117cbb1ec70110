#include "cc/core/table_io.h"

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

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

// Reads the records after the header in batches of at most chunk_rows rows,
// inserting each batch into `table` (or, with table == nullptr, only checking
// that the stream is complete and well formed).
Status ReadRecords(ByteSource* source, const TableOptions& opt, int64_t chunk_rows, Table* table,
                   const Runner& runner) {
  const size_t value_bytes = opt.value_bytes();
  const bool string_keys = opt.key_type == KeyType::kString;
  const size_t key_bytes = string_keys ? 0 : NumericKeyBytes(opt.key_type);
  std::vector<char> numeric_keys;
  std::vector<std::string> string_storage;
  std::vector<std::string_view> string_keys_view;
  std::vector<char> values;
  std::vector<uint64_t> scores;
  uint64_t total = 0;
  for (;;) {
    uint64_t n = 0;
    DYNEMB_RETURN_IF_ERROR(ReadExact(source, &n, sizeof(n), "a record size"));
    if (n == 0) break;
    for (uint64_t done = 0; done < n;) {
      const uint64_t batch = std::min<uint64_t>(n - done, static_cast<uint64_t>(chunk_rows));
      numeric_keys.resize(batch * key_bytes);
      string_storage.resize(string_keys ? batch : 0);
      values.resize(batch * value_bytes);
      scores.resize(batch);
      for (uint64_t i = 0; i < batch; ++i) {
        if (string_keys) {
          uint32_t len = 0;
          DYNEMB_RETURN_IF_ERROR(ReadExact(source, &len, sizeof(len), "a key length"));
          string_storage[i].resize(len);
          if (len > 0) DYNEMB_RETURN_IF_ERROR(ReadExact(source, &string_storage[i][0], len, "a key"));
        } else {
          DYNEMB_RETURN_IF_ERROR(
              ReadExact(source, numeric_keys.data() + i * key_bytes, key_bytes, "a key"));
        }
        DYNEMB_RETURN_IF_ERROR(ReadExact(source, &scores[i], sizeof(uint64_t), "a score"));
        DYNEMB_RETURN_IF_ERROR(
            ReadExact(source, values.data() + i * value_bytes, value_bytes, "a value row"));
      }
      if (table != nullptr) {
        const void* keys = numeric_keys.data();
        if (string_keys) {
          string_keys_view.assign(string_storage.begin(), string_storage.end());
          keys = string_keys_view.data();
        }
        DYNEMB_RETURN_IF_ERROR(
            table->Insert(keys, static_cast<int64_t>(batch), values.data(), scores.data(), runner));
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

Status LoadTable(ByteSource* source, Table& table, int64_t chunk_rows, bool clear_first,
                 const Runner& runner) {
  if (chunk_rows < 1) {
    return InvalidArgument("chunk_rows must be >= 1, got " + std::to_string(chunk_rows));
  }
  const TableOptions& opt = table.options();
  if (clear_first) {
    // A damaged file must not cost the table its content: read it through
    // once before clearing (reading is far cheaper than inserting).
    DYNEMB_RETURN_IF_ERROR(ReadHeader(source, opt));
    DYNEMB_RETURN_IF_ERROR(ReadRecords(source, opt, chunk_rows, nullptr, runner));
    DYNEMB_RETURN_IF_ERROR(source->Rewind());
  }
  DYNEMB_RETURN_IF_ERROR(ReadHeader(source, opt));
  if (clear_first) table.Clear();
  return ReadRecords(source, opt, chunk_rows, &table, runner);
}

}  // namespace dynemb
