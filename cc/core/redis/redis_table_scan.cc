// RedisTable's whole-table reads (redis_table_impl.h): HSCAN of every bucket
// into exports, chunks and snapshots.

#include <string>
#include <unordered_set>
#include <vector>

#include "cc/core/redis/redis_table_impl.h"

namespace dynemb {
namespace redis {
namespace internal {

Status RedisTable::ScanBucket(const std::string& bucket, const ScanSink& take) {
  NodePool* pool = router_.PoolFor(bucket);
  const size_t key_bytes = options_.key_type == KeyType::kInt32 ? 4 : 8;
  std::unordered_set<std::string> seen;  // HSCAN may return a field twice
  std::string cursor = "0";
  const std::string count = std::to_string(config_.keys_sending_size);
  do {
    Command c;
    c.Add("HSCAN"), c.Add(bucket), c.Add(cursor), c.Add("COUNT"), c.Add(count);
    std::vector<Reply> replies;
    DYNEMB_RETURN_IF_ERROR(pool->Run({c}, &replies, true));
    const redisReply* r = replies[0].get();
    DYNEMB_RETURN_IF_ERROR(ReplyStatus(r, "HSCAN " + bucket));
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
      return Status(StatusCode::kInternal, "HSCAN " + bucket + ": unexpected reply");
    }
    cursor.assign(r->element[0]->str, r->element[0]->len);
    const redisReply* items = r->element[1];
    std::vector<std::string_view> keys;
    std::vector<const char*> rows;
    for (size_t j = 0; j + 1 < items->elements; j += 2) {
      const redisReply* k = items->element[j];
      const redisReply* v = items->element[j + 1];
      if (options_.key_type != KeyType::kString && k->len != key_bytes) {
        return InvalidArgument("Redis bucket " + bucket + " holds a key of " +
                               std::to_string(k->len) + " bytes, but this table's keys are " +
                               KeyTypeName(options_.key_type) + " (" + std::to_string(key_bytes) +
                               " bytes): a table of that name with another key dtype wrote it");
      }
      DYNEMB_RETURN_IF_ERROR(CheckWidth(v, bucket));
      if (!seen.emplace(k->str, k->len).second) continue;
      keys.emplace_back(k->str, k->len);
      rows.push_back(v->str);
    }
    DYNEMB_RETURN_IF_ERROR(take(keys, rows));
  } while (cursor != "0");
  return Status::Ok();
}

Status RedisTable::ExportChunks(int64_t chunk_rows, const ChunkSink& sink) {
  if (chunk_rows < 1) return InvalidArgument("ExportChunks: chunk_rows must be >= 1");
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {
    DYNEMB_RETURN_IF_ERROR(ScanBucket(buckets_[b], [&](const std::vector<std::string_view>& k,
                                             const std::vector<const char*>& r) {
      for (size_t begin = 0; begin < k.size(); begin += chunk_rows) {
        const size_t end = std::min(k.size(), begin + static_cast<size_t>(chunk_rows));
        const size_t m = end - begin;
        std::string rows;
        rows.reserve(m * value_bytes_);
        for (size_t j = begin; j < end; ++j) rows.append(r[j], value_bytes_);
        std::vector<uint64_t> scores(m, 0);
        const BatchKeys keys(options_.key_type, m, [&](size_t j) { return k[begin + j]; });
        DYNEMB_RETURN_IF_ERROR(sink(keys.data(), static_cast<int64_t>(m), rows.data(), scores.data()));
      }
      return Status::Ok();
    }));
  }
  return Status::Ok();
}

// The rows of a table read into memory: keys in the batch representation.
class RedisSnapshot final : public TableSnapshot {
 public:
  RedisSnapshot(KeyType key_type, size_t value_bytes) : key_type_(key_type), value_bytes_(value_bytes) {}
  void Add(std::string_view key, const char* row) {
    keys_.emplace_back(key);
    rows_.append(row, value_bytes_);
  }
  int64_t size() const override { return static_cast<int64_t>(keys_.size()); }
  const std::string& key(int64_t i) const { return keys_[i]; }  // the key's bytes
  const char* rows() const { return rows_.data(); }
  Status Read(int64_t begin, int64_t end, int64_t chunk_rows, const ChunkSink& sink) const override {
    if (begin < 0 || end > size() || begin > end || chunk_rows < 1) {
      return InvalidArgument("TableSnapshot::Read: bad range or chunk_rows");
    }
    for (int64_t b = begin; b < end; b += chunk_rows) {
      const int64_t m = std::min(end, b + chunk_rows) - b;
      std::vector<uint64_t> scores(m, 0);
      const BatchKeys keys(key_type_, static_cast<size_t>(m),
                           [&](size_t j) { return std::string_view(keys_[b + j]); });
      DYNEMB_RETURN_IF_ERROR(sink(keys.data(), m, rows_.data() + b * value_bytes_, scores.data()));
    }
    return Status::Ok();
  }

 private:
  const KeyType key_type_;
  const size_t value_bytes_;
  std::vector<std::string> keys_;
  std::string rows_;
};

Status RedisTable::Snapshot(std::unique_ptr<TableSnapshot>* snapshot) {
  auto snap = std::make_unique<RedisSnapshot>(options_.key_type, value_bytes_);
  // Not a consistent point in time when other writers are active: Redis has no
  // multi-key read that would not block the server meanwhile.
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {
    DYNEMB_RETURN_IF_ERROR(ScanBucket(buckets_[b], [&](const std::vector<std::string_view>& k,
                                             const std::vector<const char*>& r) {
      for (size_t j = 0; j < k.size(); ++j) snap->Add(k[j], r[j]);
      return Status::Ok();
    }));
  }
  *snapshot = std::move(snap);
  return Status::Ok();
}

Status RedisTable::Export(ExportSink* sink, const Runner& runner) {
  (void)runner;
  std::unique_ptr<TableSnapshot> snapshot;
  DYNEMB_RETURN_IF_ERROR(Snapshot(&snapshot));
  const auto& snap = static_cast<const RedisSnapshot&>(*snapshot);
  const int64_t n = snap.size();
  void* keys = nullptr;
  void* values = nullptr;
  uint64_t* scores = nullptr;
  DYNEMB_RETURN_IF_ERROR(sink->Allocate(n, &keys, &values, &scores));
  for (int64_t i = 0; i < n; ++i) {
    const std::string& key = snap.key(i);
    if (options_.key_type == KeyType::kString) {
      sink->SetStringKey(i, key);
    } else if (keys != nullptr) {
      std::memcpy(static_cast<char*>(keys) + i * key.size(), key.data(), key.size());
    }
  }
  if (values != nullptr && n > 0) std::memcpy(values, snap.rows(), n * value_bytes_);
  if (scores != nullptr) std::fill(scores, scores + n, 0);
  return Status::Ok();
}


}  // namespace internal
}  // namespace redis
}  // namespace dynemb
