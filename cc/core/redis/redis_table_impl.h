// The Table of redis_table.h, declared for its two source files:
// redis_table.cc (batch ops) and redis_table_scan.cc (whole-table reads).
// Internal: include redis_table.h instead.

#ifndef DYNEMB_CORE_REDIS_REDIS_TABLE_IMPL_H_
#define DYNEMB_CORE_REDIS_REDIS_TABLE_IMPL_H_

#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/crc32c.h"
#include "cc/core/redis/redis_client.h"
#include "cc/core/redis/redis_config.h"
#include "cc/core/redis/redis_router.h"
#include "cc/core/redis/redis_table.h"
#include "cc/core/table.h"

namespace dynemb {
namespace redis {
namespace internal {

// Keys given as their bytes in Redis (key_at(j), j < m), in the batch
// representation of table.h: int32 / int64 arrays, or string_views.
class BatchKeys {
 public:
  template <typename KeyAt>
  BatchKeys(KeyType key_type, size_t m, KeyAt&& key_at) {
    if (key_type == KeyType::kString) {
      for (size_t j = 0; j < m; ++j) strings_.push_back(key_at(j));
      data_ = strings_.data();
    } else if (key_type == KeyType::kInt64) {
      ints64_.resize(m);
      for (size_t j = 0; j < m; ++j) std::memcpy(&ints64_[j], key_at(j).data(), 8);
      data_ = ints64_.data();
    } else {
      ints32_.resize(m);
      for (size_t j = 0; j < m; ++j) std::memcpy(&ints32_[j], key_at(j).data(), 4);
      data_ = ints32_.data();
    }
  }
  BatchKeys(const BatchKeys&) = delete;
  BatchKeys& operator=(const BatchKeys&) = delete;
  const void* data() const { return data_; }

 private:
  std::vector<std::string_view> strings_;
  std::vector<int64_t> ints64_;
  std::vector<int32_t> ints32_;
  const void* data_ = nullptr;
};

class RedisTable final : public Table {
 public:
  RedisTable(const TableOptions& options, const RedisConfig& config, std::string embedding_name)
      : options_(options), config_(config), embedding_name_(std::move(embedding_name)),
        router_(config), value_bytes_(options.value_bytes()) {}

  ~RedisTable() override {
    // As TFRA: buckets of a table no process holds expire after a while.
    if (ready_ && config_.expire_model_tag_in_seconds > 0) {
      (void)AllBuckets("EXPIRE", std::to_string(config_.expire_model_tag_in_seconds), nullptr);
    }
  }

  Status Init() {
    DYNEMB_RETURN_IF_ERROR(options_.Validate());
    DYNEMB_RETURN_IF_ERROR(config_.Validate());
    DYNEMB_RETURN_IF_ERROR(router_.Init());
    std::vector<std::pair<int, int>> ranges;
    if (router_.cluster() && !config_.redis_hash_tags_hypodispersion) ranges = router_.MasterFirstRanges();
    buckets_ = BucketNames(config_, embedding_name_, ranges);
    ready_ = true;
    DYNEMB_RETURN_IF_ERROR(AllBuckets("PERSIST", "", nullptr));
    return MoveFromImportLayout(ranges);
  }

  const TableOptions& options() const override { return options_; }

  int64_t Size() const override {
    int64_t n = 0;
    (void)CheckedSize(&n);
    return n;
  }
  Status CheckedSize(int64_t* size) const override {
    std::vector<int64_t> per_bucket;
    DYNEMB_RETURN_IF_ERROR(const_cast<RedisTable*>(this)->AllBuckets("HLEN", "", &per_bucket));
    *size = 0;
    for (int64_t n : per_bucket) *size += n;
    last_size_ = *size;
    return Status::Ok();
  }
  int64_t Capacity() const override { return last_size_; }
  int64_t MemoryBytes() const override { return 0; }  // the rows live in Redis
  TableCounters Counters() const override {
    TableCounters c;
    c.inserts = inserts_.load(), c.updates = updates_.load(), c.lookups = lookups_.load();
    c.misses = misses_.load(), c.removes = removes_.load();
    return c;
  }

  Status FindRows(const void* keys, int64_t n, void* values, bool* exists, const void* defaults,
                  bool default_per_key, bool update_scores, const Runner& runner) override {
    (void)update_scores;  // Redis keeps no scores
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, values, "values"));
    if (n > 0 && defaults == nullptr) return InvalidArgument("FindRows: defaults must not be null");
    std::atomic<int64_t> misses{0};
    // Lookups read replicas with redis_read_access_slave; ApplyRule and
    // accum read the masters they write.
    Status s = ForGroups(keys, n, runner, /*retry=*/true,
        [&](const Group& g, std::vector<Command>* cmds) { KeyCommands(g, "HMGET", keys, cmds); },
        [&](const Group& g, std::vector<Reply>& replies) -> Status {
          int64_t at = 0;
          for (Reply& r : replies) {
            DYNEMB_RETURN_IF_ERROR(ReplyStatus(r.get(), "HMGET from " + buckets_[g.bucket]));
            if (r->type != REDIS_REPLY_ARRAY) return Status(StatusCode::kInternal, "HMGET: not an array");
            for (size_t j = 0; j < r->elements && at < g.n; ++j, ++at) {
              const int64_t i = g.rows[at];
              char* out = static_cast<char*>(values) + i * value_bytes_;
              const redisReply* e = r->element[j];
              const bool found = e->type == REDIS_REPLY_STRING;
              if (found) {
                DYNEMB_RETURN_IF_ERROR(CheckWidth(e, g.bucket));
                std::memcpy(out, e->str, value_bytes_);
              } else {
                const char* d = static_cast<const char*>(defaults) + (default_per_key ? i * value_bytes_ : 0);
                std::memcpy(out, d, value_bytes_);
                misses.fetch_add(1, std::memory_order_relaxed);
              }
              if (exists != nullptr) exists[i] = found;
            }
          }
          return Status::Ok();
        },
        /*read=*/true);
    lookups_ += n, misses_ += misses.load();
    return s;
  }

  Status InsertAndEvict(const void* keys, int64_t n, const void* values, const uint64_t* scores,
                        EvictedEntries* evicted, const Runner& runner) override {
    (void)scores;  // no scores in Redis
    if (evicted != nullptr) evicted->count = 0;  // never evicts
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, values, "values"));
    const char* rows = static_cast<const char*>(values);
    Status s = ForGroups(keys, n, runner, /*retry=*/true,
        [&](const Group& g, std::vector<Command>* cmds) {
          SetCommands(g, keys, [&](int64_t i) { return rows + i * value_bytes_; }, cmds);
        },
        [&](const Group& g, std::vector<Reply>& replies) -> Status {
          for (Reply& r : replies) {
            DYNEMB_RETURN_IF_ERROR(ReplyStatus(r.get(), "HSET into " + buckets_[g.bucket]));
            if (r->type == REDIS_REPLY_INTEGER) inserts_ += r->integer;
          }
          return Status::Ok();
        });
    return s;
  }

  Status AccumAndEvict(const void* keys, int64_t n, const void* deltas, const bool* exists,
                       EvictedEntries* evicted, const Runner& runner) override;

  Status ApplyRule(const void* keys, int64_t n, const void* initial, const RuleStep& step,
                   const Runner& runner) override {
    DYNEMB_RETURN_IF_ERROR(CheckRuleStep(options_, keys, n, initial, step));
    if (options_.value_type == ValueType::kFloat64) return ApplyRuleAs<double>(keys, n, initial, step, runner);
    return ApplyRuleAs<float>(keys, n, initial, step, runner);
  }

  Status Remove(const void* keys, int64_t n, const Runner& runner) override {
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, keys, "keys"));
    return ForGroups(keys, n, runner, /*retry=*/true,
        [&](const Group& g, std::vector<Command>* cmds) { KeyCommands(g, "HDEL", keys, cmds); },
        [&](const Group& g, std::vector<Reply>& replies) -> Status {
          for (Reply& r : replies) {
            DYNEMB_RETURN_IF_ERROR(ReplyStatus(r.get(), "HDEL from " + buckets_[g.bucket]));
            if (r->type == REDIS_REPLY_INTEGER) removes_ += r->integer;
          }
          return Status::Ok();
        });
  }

  void Clear() override { (void)CheckedClear(); }
  Status CheckedClear() override { return AllBuckets("DEL", "", nullptr); }

  Status Export(ExportSink* sink, const Runner& runner) override;
  Status ExportChunks(int64_t chunk_rows, const ChunkSink& sink) override;
  // Reads every row into memory (Redis has no snapshot a client could hold);
  // the streaming checkpoint saver then writes it in slices.
  Status Snapshot(std::unique_ptr<TableSnapshot>* snapshot) override;

 private:
  // The rows of a batch that go to one bucket on one connection: batch row
  // indices rows[0..n), in batch order.
  struct Group {
    int bucket;
    const int64_t* rows;
    int64_t n;
  };
  using Build = std::function<void(const Group&, std::vector<Command>*)>;
  using Parse = std::function<Status(const Group&, std::vector<Reply>&)>;

  // CheckBatchArgs, where an empty batch may come with null pointers.
  static Status CheckBatch(const void* keys, int64_t n, const void* data, const char* what) {
    return n == 0 ? Status::Ok() : CheckBatchArgs(keys, n, data, what, INT64_MAX, "[0, 2^63)");
  }

  std::string_view KeyBytes(const void* keys, int64_t i) const {
    switch (options_.key_type) {
      case KeyType::kInt32: return {reinterpret_cast<const char*>(static_cast<const int32_t*>(keys) + i), 4};
      case KeyType::kInt64: return {reinterpret_cast<const char*>(static_cast<const int64_t*>(keys) + i), 8};
      default: return static_cast<const std::string_view*>(keys)[i];
    }
  }
  void AddKey(Command* c, const void* keys, int64_t i) const {
    const std::string_view k = KeyBytes(keys, i);
    c->Add(k.data(), k.size());
  }
  // The longest string TF's tstring stores inline (TF_TString_SmallCapacity).
  static constexpr size_t kInlineStringBytes = 22;

  // TFRA's bucket of a key (redis_table.h, "Key layout").
  int BucketOf(const void* keys, int64_t i) const {
    if (!router_.cluster() || buckets_.size() == 1) return 0;
    const std::string_view k = KeyBytes(keys, i);
    uint32_t h;
    if (options_.key_type == KeyType::kString && k.size() <= kInlineStringBytes) {
      // TFRA hashes the first size() bytes of TF's tstring object rather than of
      // the string. A string of up to 22 bytes is stored inline, after one byte
      // holding size << 2: so those bytes are that byte and the string's first
      // size - 1 bytes. (A longer string's object holds a pointer: TFRA's bucket
      // then depends on where the string is, and CRC32C of the bytes is used.)
      char inline_object[kInlineStringBytes];
      inline_object[0] = static_cast<char>(k.size() << 2);
      if (k.size() > 1) std::memcpy(inline_object + 1, k.data(), k.size() - 1);
      h = ~Crc32c(inline_object, k.size());  // TFRA's raw CRC32C from 0xffffffff
    } else if (options_.key_type == KeyType::kString || config_.using_hash_storage_slice) {
      h = ~Crc32c(k.data(), k.size());
    } else if (options_.key_type == KeyType::kInt64) {
      h = static_cast<uint32_t>(*reinterpret_cast<const int64_t*>(k.data()) & 0xffffffffll);
    } else {
      h = static_cast<uint32_t>(*reinterpret_cast<const int32_t*>(k.data()));
    }
    return static_cast<int>(h % buckets_.size());
  }

  Status CheckWidth(const redisReply* e, int bucket) const { return CheckWidth(e, buckets_[bucket]); }
  Status CheckWidth(const redisReply* e, const std::string& bucket) const {
    if (e->len == value_bytes_) return Status::Ok();
    return InvalidArgument("Redis bucket " + bucket + " holds a row of " +
                           std::to_string(e->len) + " bytes, but this table's rows are " +
                           std::to_string(options_.dim) + " x " + ValueTypeName(options_.value_type) +
                           " = " + std::to_string(value_bytes_) +
                           " bytes: another table of that name with another dim or dtype wrote it");
  }

  // Commands "<verb> bucket key..." of at most keys_sending_size keys.
  void KeyCommands(const Group& g, const char* verb, const void* keys,
                   std::vector<Command>* cmds) const {
    for (int64_t b = 0; b < g.n; b += config_.keys_sending_size) {
      const int64_t e = std::min(g.n, b + config_.keys_sending_size);
      Command c;
      c.Add(verb), c.Add(buckets_[g.bucket]);
      for (int64_t at = b; at < e; ++at) AddKey(&c, keys, g.rows[at]);
      cmds->push_back(std::move(c));
    }
  }
  // Commands "HSET bucket key row key row..." (row i of the batch at
  // row_of(i)).
  template <typename RowOf>
  void SetCommands(const Group& g, const void* keys, const RowOf& row_of,
                   std::vector<Command>* cmds) const {
    for (int64_t b = 0; b < g.n; b += config_.keys_sending_size) {
      const int64_t e = std::min(g.n, b + config_.keys_sending_size);
      Command c;
      c.Add("HSET"), c.Add(buckets_[g.bucket]);
      for (int64_t at = b; at < e; ++at) {
        const int64_t i = g.rows[at];
        AddKey(&c, keys, i);
        c.Add(row_of(i), value_bytes_);
      }
      cmds->push_back(std::move(c));
    }
  }

  // Groups the batch (design comment), then builds, runs and parses each
  // group's commands, groups in parallel on `runner`. The first error wins.
  // `read`: the commands only read, and may go to a replica
  // (Router::ReadPoolFor).
  Status ForGroups(const void* keys, int64_t n, const Runner& runner, bool retry,
                   const Build& build, const Parse& parse, bool read = false);

  template <typename T>
  Status ApplyRuleAs(const void* keys, int64_t n, const void* initial, const RuleStep& step,
                     const Runner& runner);

  // Runs "<verb> bucket [arg]" on every bucket; *ints receives integer replies.
  Status AllBuckets(const char* verb, const std::string& arg, std::vector<int64_t>* ints);

  // Reads every row of the bucket named `bucket` with HSCAN, calling
  // `take(keys, rows)` per reply (each key once).
  using ScanSink = std::function<Status(const std::vector<std::string_view>&,
                                        const std::vector<const char*>&)>;
  Status ScanBucket(const std::string& bucket, const ScanSink& take);

  // TFRA's rehash when a table opens (redis_table_rehash.cc): moves the rows
  // of the import layout's buckets to their runtime buckets.
  Status MoveFromImportLayout(const std::vector<std::pair<int, int>>& ranges);
  // BucketOf for a key given as its bytes in Redis.
  int BucketOfBytes(std::string_view key) const;

  const TableOptions options_;
  const RedisConfig config_;
  const std::string embedding_name_;
  mutable Router router_;
  const size_t value_bytes_;
  std::vector<std::string> buckets_;
  bool ready_ = false;
  mutable std::atomic<int64_t> last_size_{0};
  std::atomic<uint64_t> inserts_{0}, updates_{0}, lookups_{0}, misses_{0}, removes_{0};
};

}  // namespace internal
}  // namespace redis
}  // namespace dynemb

#endif  // DYNEMB_CORE_REDIS_REDIS_TABLE_IMPL_H_
