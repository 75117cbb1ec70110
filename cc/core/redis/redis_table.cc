// RedisTable: the Table of redis_table.h (design there).

#include "cc/core/redis/redis_table.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <cstring>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "cc/core/crc32c.h"
#include "cc/core/redis/md5.h"
#include "cc/core/redis/redis_client.h"
#include "cc/core/redis/redis_router.h"
#include "cc/core/update_rules.h"

namespace dynemb {
namespace redis {

std::string EmbeddingName(const std::string& table_name) {
  return table_name.substr(0, table_name.find("_mht_"));
}

std::vector<std::string> BucketNames(const RedisConfig& config, const std::string& embedding_name,
                                     const std::vector<std::pair<int, int>>& ranges) {
  std::string prefix = config.model_tag_runtime + ":" + embedding_name;
  if (config.using_md5_prefix_name) {
    const auto digest = Md5(prefix);
    prefix.assign(reinterpret_cast<const char*>(digest.data()), digest.size());
  }
  const unsigned slices = static_cast<unsigned>(config.storage_slice);
  std::vector<std::string> names;
  const auto tagged = [&](unsigned slot) {
    names.push_back(prefix + "{" + std::to_string(SlotTagNumber(static_cast<int>(slot))) + "}");
  };
  if (config.redis_hash_tags_runtime.size() == slices) {
    for (std::string tag : config.redis_hash_tags_runtime) {
      if (tag.back() != '}') tag.push_back('}');
      if (tag.front() != '{') tag.insert(tag.begin(), '{');
      names.push_back(prefix + tag);
    }
  } else if (ranges.empty()) {
    // Spread over the 16384 slots.
    for (unsigned i = 0; i < slices; ++i) tagged(16384 / slices * i + 16384 % slices);
  } else if (ranges.size() < slices) {
    // Several buckets per master, spread inside each master's first range.
    const unsigned r = static_cast<unsigned>(ranges.size());
    for (unsigned i = 0; i < slices;) {
      for (const auto& [lo, hi] : ranges) {
        const unsigned span = static_cast<unsigned>(hi - lo) * r / slices;
        tagged(static_cast<unsigned>(lo) + i / r * span);
        if (++i == slices) break;
      }
    }
  } else {
    for (unsigned i = 0; i < slices; ++i) tagged(static_cast<unsigned>(ranges[i].first));
  }
  return names;
}

namespace {

// The Lua script of accum: per (key, delta, exists) triple, as Table::Accum
// says, applied in order (a key's later rows see its earlier ones). ARGV: the
// struct format of one element (e.g. "<f"), dim, "1" for bool (logical or),
// then the triples. Reads with HMGET and writes with HSET in blocks of 500
// keys; whole rows are (un)packed at once up to 2000 elements. Atomic per
// call on the server (a script runs alone).
constexpr char kAccumScript[] = R"lua(
local fmt, dim, isbool = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local h, n = KEYS[1], (#ARGV - 3) / 3
local elem = string.sub(fmt, 2)
local row = dim <= 2000 and ('<' .. string.rep(elem, dim)) or nil
local size = struct.size(fmt)
local state = {}
for b = 1, n, 500 do
  local ks = {}
  for i = b, math.min(n, b + 499) do ks[#ks + 1] = ARGV[3 * i + 1] end
  local vals = redis.call('HMGET', h, unpack(ks))
  for j = 1, #ks do
    if state[ks[j]] == nil then state[ks[j]] = vals[j] end
  end
end
local function unpack_row(s)
  if row then return {struct.unpack(row, s)} end
  local t = {}
  for j = 1, dim do t[j] = struct.unpack(fmt, s, (j - 1) * size + 1) end
  return t
end
local function pack_row(t)
  if row then return struct.pack(row, unpack(t, 1, dim)) end
  local parts = {}
  for j = 1, dim do parts[j] = struct.pack(fmt, t[j]) end
  return table.concat(parts)
end
local dirty = {}
for i = 1, n do
  local k, d, e = ARGV[3 * i + 1], ARGV[3 * i + 2], ARGV[3 * i + 3]
  local c = state[k]
  if e == '1' then
    if c then
      local a, x = unpack_row(c), unpack_row(d)
      for j = 1, dim do
        if isbool then
          if a[j] ~= 0 or x[j] ~= 0 then a[j] = 1 else a[j] = 0 end
        else
          a[j] = a[j] + x[j]
        end
      end
      state[k] = pack_row(a)
      dirty[k] = true
    end
  elseif not c then
    state[k] = d
    dirty[k] = true
  end
end
local args = {}
for k, _ in pairs(dirty) do
  args[#args + 1] = k
  args[#args + 1] = state[k]
  if #args >= 1000 then
    redis.call('HSET', h, unpack(args))
    args = {}
  end
end
if #args > 0 then redis.call('HSET', h, unpack(args)) end
return 0
)lua";

const char* StructFormat(ValueType type) {
  switch (type) {
    case ValueType::kFloat32: return "<f";
    case ValueType::kFloat64: return "<d";
    case ValueType::kInt8: return "<b";
    case ValueType::kInt32: return "<i4";
    case ValueType::kInt64: return "<i8";
    case ValueType::kBool: return "<B";
    default: return nullptr;  // float16 / bfloat16: Lua has no such format
  }
}

inline uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27, x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

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
    return AllBuckets("PERSIST", "", nullptr);
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
        });
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
                       EvictedEntries* evicted, const Runner& runner) override {
    if (evicted != nullptr) evicted->count = 0;
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, deltas, "deltas"));
    const char* fmt = StructFormat(options_.value_type);
    if (fmt == nullptr) {
      return InvalidArgument(std::string("accum on a Redis table supports float32, float64, int8, "
                                         "int32, int64 and bool values, not ") +
                             ValueTypeName(options_.value_type));
    }
    if (n > 0 && exists == nullptr) return InvalidArgument("AccumAndEvict: exists must not be null");
    const std::string dim = std::to_string(options_.dim);
    const bool is_bool = options_.value_type == ValueType::kBool;
    static const char kOne = '1', kZero = '0';
    // Not re-sent on a lost connection: the script may have run.
    return ForGroups(keys, n, runner, /*retry=*/false,
        [&](const Group& g, std::vector<Command>* cmds) {
          for (int64_t b = 0; b < g.n; b += config_.keys_sending_size) {
            const int64_t e = std::min(g.n, b + config_.keys_sending_size);
            Command c;
            c.Add("EVAL"), c.Add(kAccumScript), c.Add("1"), c.Add(buckets_[g.bucket]);
            c.Add(fmt, std::strlen(fmt)), c.Add(dim), c.Add(is_bool ? "1" : "0");
            for (int64_t at = b; at < e; ++at) {
              const int64_t i = g.rows[at];
              AddKey(&c, keys, i);
              c.Add(static_cast<const char*>(deltas) + i * value_bytes_, value_bytes_);
              c.Add(exists[i] ? &kOne : &kZero, 1);
            }
            cmds->push_back(std::move(c));
          }
        },
        [&](const Group& g, std::vector<Reply>& replies) -> Status {
          for (Reply& r : replies) {
            DYNEMB_RETURN_IF_ERROR(ReplyStatus(r.get(), "accum into " + buckets_[g.bucket]));
          }
          updates_ += g.n;
          return Status::Ok();
        });
  }

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
  // TFRA's bucket of a key (redis_table.h, "Key layout").
  int BucketOf(const void* keys, int64_t i) const {
    if (!router_.cluster() || buckets_.size() == 1) return 0;
    const std::string_view k = KeyBytes(keys, i);
    uint32_t h;
    if (options_.key_type == KeyType::kString || config_.using_hash_storage_slice) {
      h = ~Crc32c(k.data(), k.size());  // TFRA's raw CRC32C from 0xffffffff
    } else if (options_.key_type == KeyType::kInt64) {
      h = static_cast<uint32_t>(*reinterpret_cast<const int64_t*>(k.data()) & 0xffffffffll);
    } else {
      h = static_cast<uint32_t>(*reinterpret_cast<const int32_t*>(k.data()));
    }
    return static_cast<int>(h % buckets_.size());
  }

  Status CheckWidth(const redisReply* e, int bucket) const {
    if (e->len == value_bytes_) return Status::Ok();
    return InvalidArgument("Redis bucket " + buckets_[bucket] + " holds a row of " +
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
  Status ForGroups(const void* keys, int64_t n, const Runner& runner, bool retry,
                   const Build& build, const Parse& parse);

  template <typename T>
  Status ApplyRuleAs(const void* keys, int64_t n, const void* initial, const RuleStep& step,
                     const Runner& runner);

  // Runs "<verb> bucket [arg]" on every bucket; *ints receives integer replies.
  Status AllBuckets(const char* verb, const std::string& arg, std::vector<int64_t>* ints);

  // Reads every row of bucket b with HSCAN, calling `take(keys, n, rows)`
  // per reply (each key once).
  Status ScanBucket(int b, const std::function<Status(const std::vector<std::string_view>&,
                                                      const std::vector<const char*>&)>& take);

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


Status RedisTable::ForGroups(const void* keys, int64_t n, const Runner& runner, bool retry,
                             const Build& build, const Parse& parse) {
  if (n == 0) return Status::Ok();
  const int64_t buckets = static_cast<int64_t>(buckets_.size());
  const int64_t per_lane = config_.keys_sending_size * 4;
  const int64_t lanes = std::max<int64_t>(
      1, std::min<int64_t>({(n + per_lane - 1) / per_lane, config_.redis_conn_pool_size, 8}));
  // A stable counting sort of the rows by (bucket, lane).
  std::vector<int32_t> group_of(n);
  std::vector<int64_t> start(buckets * lanes + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t lane = 0;
    if (lanes > 1) {
      const std::string_view k = KeyBytes(keys, i);
      const uint64_t h = options_.key_type == KeyType::kString
                             ? Crc32c(k.data(), k.size())
                             : (options_.key_type == KeyType::kInt64
                                    ? static_cast<uint64_t>(static_cast<const int64_t*>(keys)[i])
                                    : static_cast<uint64_t>(static_cast<const int32_t*>(keys)[i]));
      lane = static_cast<int64_t>(Mix(h) % static_cast<uint64_t>(lanes));
    }
    group_of[i] = static_cast<int32_t>(BucketOf(keys, i) * lanes + lane);
    ++start[group_of[i] + 1];
  }
  for (size_t g = 1; g < start.size(); ++g) start[g] += start[g - 1];
  std::vector<int64_t> order(n);
  {
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[next[group_of[i]]++] = i;
  }
  std::vector<Group> groups;
  for (size_t g = 0; g + 1 < start.size(); ++g) {
    if (start[g + 1] > start[g]) {
      groups.push_back({static_cast<int>(g / lanes), order.data() + start[g], start[g + 1] - start[g]});
    }
  }
  std::mutex mu;
  Status first;
  runner.ParallelFor(static_cast<int64_t>(groups.size()), int64_t{1} << 24,
                     [&](int64_t begin, int64_t end) {
    for (int64_t gi = begin; gi < end; ++gi) {
      const Group& g = groups[gi];
      std::vector<Command> cmds;
      build(g, &cmds);
      std::vector<Reply> replies;
      Status s = router_.PoolFor(buckets_[g.bucket])->Run(cmds, &replies, retry);
      if (s.ok() && router_.cluster() && !replies.empty() && IsRedirect(replies[0].get())) {
        // The bucket's slot moved: every command of the group was refused
        // (one bucket, one slot), so sending them again is safe.
        s = router_.Refresh();
        if (s.ok()) s = router_.PoolFor(buckets_[g.bucket])->Run(cmds, &replies, retry);
      }
      if (s.ok()) s = parse(g, replies);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.ok()) first = s;
        return;
      }
    }
  });
  return first;
}

template <typename T>
Status RedisTable::ApplyRuleAs(const void* keys, int64_t n, const void* initial,
                               const RuleStep& step, const Runner& runner) {
  const int64_t width = options_.dim;  // slots * step.dim
  const T* coefficients = static_cast<const T*>(step.coefficients);
  const T* rows = static_cast<const T*>(step.rows);
  const T* grads = static_cast<const T*>(step.grads);
  T* new_rows = static_cast<T*>(step.new_rows);
  return ForGroups(keys, n, runner, /*retry=*/true,
      [&](const Group& g, std::vector<Command>* cmds) { KeyCommands(g, "HMGET", keys, cmds); },
      [&](const Group& g, std::vector<Reply>& replies) -> Status {
        // Each row starts from the state the previous row of its key left,
        // else from Redis, else from `initial`.
        std::vector<T> states(static_cast<size_t>(g.n * width));
        std::unordered_map<std::string_view, int64_t> latest;
        int64_t at = 0;
        for (Reply& r : replies) {
          DYNEMB_RETURN_IF_ERROR(ReplyStatus(r.get(), "HMGET from " + buckets_[g.bucket]));
          for (size_t j = 0; j < r->elements && at < g.n; ++j, ++at) {
            const int64_t i = g.rows[at];
            T* state = states.data() + at * width;
            const std::string_view key = KeyBytes(keys, i);
            const auto it = latest.find(key);
            const redisReply* e = r->element[j];
            if (it != latest.end()) {
              std::memcpy(state, states.data() + it->second * width, value_bytes_);
            } else if (e->type == REDIS_REPLY_STRING) {
              DYNEMB_RETURN_IF_ERROR(CheckWidth(e, g.bucket));
              std::memcpy(state, e->str, value_bytes_);
            } else {
              std::memcpy(state, initial, value_bytes_);
              ++inserts_;
            }
            ApplyRuleToRow<T>(step.rule, step.weight_decay, coefficients, step.dim,
                              rows + i * step.dim, grads + i * step.dim, state,
                              new_rows + i * step.dim);
            latest[key] = at;
          }
        }
        // Written in batch order: a key's last state wins.
        std::vector<Command> cmds;
        std::unordered_map<int64_t, int64_t> position;  // batch row -> group position
        for (int64_t p = 0; p < g.n; ++p) position[g.rows[p]] = p;
        SetCommands(g, keys, [&](int64_t i) {
          return reinterpret_cast<const char*>(states.data() + position[i] * width);
        }, &cmds);
        std::vector<Reply> written;
        DYNEMB_RETURN_IF_ERROR(router_.PoolFor(buckets_[g.bucket])->Run(cmds, &written, true));
        for (Reply& w : written) {
          DYNEMB_RETURN_IF_ERROR(ReplyStatus(w.get(), "HSET into " + buckets_[g.bucket]));
        }
        updates_ += g.n;
        return Status::Ok();
      });
}

Status RedisTable::AllBuckets(const char* verb, const std::string& arg, std::vector<int64_t>* ints) {
  if (ints != nullptr) ints->assign(buckets_.size(), 0);
  std::map<NodePool*, std::vector<size_t>> by_node;
  for (size_t b = 0; b < buckets_.size(); ++b) by_node[router_.PoolFor(buckets_[b])].push_back(b);
  for (auto& [pool, indices] : by_node) {
    std::vector<Command> cmds(indices.size());
    for (size_t j = 0; j < indices.size(); ++j) {
      cmds[j].Add(verb), cmds[j].Add(buckets_[indices[j]]);
      if (!arg.empty()) cmds[j].Add(arg);
    }
    std::vector<Reply> replies;
    DYNEMB_RETURN_IF_ERROR(pool->Run(cmds, &replies, true));
    for (size_t j = 0; j < indices.size(); ++j) {
      DYNEMB_RETURN_IF_ERROR(ReplyStatus(replies[j].get(), std::string(verb) + " " + buckets_[indices[j]]));
      if (ints != nullptr && replies[j]->type == REDIS_REPLY_INTEGER) {
        (*ints)[indices[j]] = replies[j]->integer;
      }
    }
  }
  return Status::Ok();
}

Status RedisTable::ScanBucket(
    int b, const std::function<Status(const std::vector<std::string_view>&,
                                      const std::vector<const char*>&)>& take) {
  NodePool* pool = router_.PoolFor(buckets_[b]);
  const size_t key_bytes = options_.key_type == KeyType::kInt32 ? 4 : 8;
  std::unordered_set<std::string> seen;  // HSCAN may return a field twice
  std::string cursor = "0";
  const std::string count = std::to_string(config_.keys_sending_size);
  do {
    Command c;
    c.Add("HSCAN"), c.Add(buckets_[b]), c.Add(cursor), c.Add("COUNT"), c.Add(count);
    std::vector<Reply> replies;
    DYNEMB_RETURN_IF_ERROR(pool->Run({c}, &replies, true));
    const redisReply* r = replies[0].get();
    DYNEMB_RETURN_IF_ERROR(ReplyStatus(r, "HSCAN " + buckets_[b]));
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
      return Status(StatusCode::kInternal, "HSCAN " + buckets_[b] + ": unexpected reply");
    }
    cursor.assign(r->element[0]->str, r->element[0]->len);
    const redisReply* items = r->element[1];
    std::vector<std::string_view> keys;
    std::vector<const char*> rows;
    for (size_t j = 0; j + 1 < items->elements; j += 2) {
      const redisReply* k = items->element[j];
      const redisReply* v = items->element[j + 1];
      if (options_.key_type != KeyType::kString && k->len != key_bytes) {
        return InvalidArgument("Redis bucket " + buckets_[b] + " holds a key of " +
                               std::to_string(k->len) + " bytes, but this table's keys are " +
                               KeyTypeName(options_.key_type) + " (" + std::to_string(key_bytes) +
                               " bytes): a table of that name with another key dtype wrote it");
      }
      DYNEMB_RETURN_IF_ERROR(CheckWidth(v, b));
      if (!seen.emplace(k->str, k->len).second) continue;
      keys.emplace_back(k->str, k->len);
      rows.push_back(v->str);
    }
    DYNEMB_RETURN_IF_ERROR(take(keys, rows));
  } while (cursor != "0");
  return Status::Ok();
}

Status RedisTable::Export(ExportSink* sink, const Runner& runner) {
  (void)runner;
  // Not a snapshot: rows written while the buckets are scanned may or may not
  // be included (Redis has no consistent multi-key read without blocking it).
  std::vector<std::string> keys;
  std::string rows;
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {
    DYNEMB_RETURN_IF_ERROR(ScanBucket(b, [&](const std::vector<std::string_view>& k,
                                             const std::vector<const char*>& r) {
      for (size_t j = 0; j < k.size(); ++j) {
        keys.emplace_back(k[j]);
        rows.append(r[j], value_bytes_);
      }
      return Status::Ok();
    }));
  }
  const int64_t n = static_cast<int64_t>(keys.size());
  void* out_keys = nullptr;
  void* out_values = nullptr;
  uint64_t* out_scores = nullptr;
  DYNEMB_RETURN_IF_ERROR(sink->Allocate(n, &out_keys, &out_values, &out_scores));
  for (int64_t i = 0; i < n; ++i) {
    if (options_.key_type == KeyType::kString) {
      sink->SetStringKey(i, keys[i]);
    } else if (out_keys != nullptr) {
      std::memcpy(static_cast<char*>(out_keys) + i * keys[i].size(), keys[i].data(), keys[i].size());
    }
  }
  if (out_values != nullptr && n > 0) std::memcpy(out_values, rows.data(), rows.size());
  if (out_scores != nullptr) std::fill(out_scores, out_scores + n, 0);
  return Status::Ok();
}

Status RedisTable::ExportChunks(int64_t chunk_rows, const ChunkSink& sink) {
  if (chunk_rows < 1) return InvalidArgument("ExportChunks: chunk_rows must be >= 1");
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {
    DYNEMB_RETURN_IF_ERROR(ScanBucket(b, [&](const std::vector<std::string_view>& k,
                                             const std::vector<const char*>& r) {
      for (size_t begin = 0; begin < k.size(); begin += chunk_rows) {
        const size_t end = std::min(k.size(), begin + static_cast<size_t>(chunk_rows));
        const size_t m = end - begin;
        std::string rows;
        rows.reserve(m * value_bytes_);
        for (size_t j = begin; j < end; ++j) rows.append(r[j], value_bytes_);
        std::vector<uint64_t> scores(m, 0);
        std::vector<std::string_view> strings;
        std::vector<int64_t> ints64;
        std::vector<int32_t> ints32;
        const void* keys;
        if (options_.key_type == KeyType::kString) {
          strings.assign(k.begin() + begin, k.begin() + end);
          keys = strings.data();
        } else if (options_.key_type == KeyType::kInt64) {
          ints64.resize(m);
          for (size_t j = 0; j < m; ++j) std::memcpy(&ints64[j], k[begin + j].data(), 8);
          keys = ints64.data();
        } else {
          ints32.resize(m);
          for (size_t j = 0; j < m; ++j) std::memcpy(&ints32[j], k[begin + j].data(), 4);
          keys = ints32.data();
        }
        DYNEMB_RETURN_IF_ERROR(sink(keys, static_cast<int64_t>(m), rows.data(), scores.data()));
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
  Status Read(int64_t begin, int64_t end, int64_t chunk_rows, const ChunkSink& sink) const override {
    if (begin < 0 || end > size() || begin > end || chunk_rows < 1) {
      return InvalidArgument("TableSnapshot::Read: bad range or chunk_rows");
    }
    for (int64_t b = begin; b < end; b += chunk_rows) {
      const int64_t m = std::min(end, b + chunk_rows) - b;
      std::vector<uint64_t> scores(m, 0);
      std::vector<std::string_view> strings;
      std::vector<int64_t> ints64;
      std::vector<int32_t> ints32;
      const void* keys;
      if (key_type_ == KeyType::kString) {
        for (int64_t j = 0; j < m; ++j) strings.emplace_back(keys_[b + j]);
        keys = strings.data();
      } else if (key_type_ == KeyType::kInt64) {
        ints64.resize(m);
        for (int64_t j = 0; j < m; ++j) std::memcpy(&ints64[j], keys_[b + j].data(), 8);
        keys = ints64.data();
      } else {
        ints32.resize(m);
        for (int64_t j = 0; j < m; ++j) std::memcpy(&ints32[j], keys_[b + j].data(), 4);
        keys = ints32.data();
      }
      DYNEMB_RETURN_IF_ERROR(sink(keys, m, rows_.data() + b * value_bytes_, scores.data()));
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
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {
    DYNEMB_RETURN_IF_ERROR(ScanBucket(b, [&](const std::vector<std::string_view>& k,
                                             const std::vector<const char*>& r) {
      for (size_t j = 0; j < k.size(); ++j) snap->Add(k[j], r[j]);
      return Status::Ok();
    }));
  }
  *snapshot = std::move(snap);
  return Status::Ok();
}

}  // namespace

std::unique_ptr<Table> NewRedisTable(const TableOptions& options, const RedisConfig& config,
                                     const std::string& embedding_name, Status* status) {
  auto table = std::make_unique<RedisTable>(options, config, embedding_name);
  *status = table->Init();
  if (!status->ok()) return nullptr;
  return table;
}

}  // namespace redis
}  // namespace dynemb
