// RedisTable: the Table of redis_table.h (design there): bucket names, batch
// grouping and the batch ops. Whole-table reads: redis_table_scan.cc.

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
#include "cc/core/redis/redis_table_impl.h"
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

}  // namespace

namespace internal {

Status RedisTable::AccumAndEvict(const void* keys, int64_t n, const void* deltas, const bool* exists,
                               EvictedEntries* evicted, const Runner& runner) {
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


Status RedisTable::ForGroups(const void* keys, int64_t n, const Runner& runner, bool retry,
                             const Build& build, const Parse& parse, bool read) {
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
      const auto pool = [&] {
        return read ? router_.ReadPoolFor(buckets_[g.bucket]) : router_.PoolFor(buckets_[g.bucket]);
      };
      Status s = pool()->Run(cmds, &replies, retry);
      if (s.ok() && router_.cluster() && !replies.empty() && IsRedirect(replies[0].get())) {
        // The bucket's slot moved: every command of the group was refused
        // (one bucket, one slot), so sending them again is safe.
        s = router_.Refresh();
        if (s.ok()) s = pool()->Run(cmds, &replies, retry);
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

}  // namespace internal

std::unique_ptr<Table> NewRedisTable(const TableOptions& options, const RedisConfig& config,
                                     const std::string& embedding_name, Status* status) {
  auto table = std::make_unique<internal::RedisTable>(options, config, embedding_name);
  *status = table->Init();
  if (!status->ok()) return nullptr;
  return table;
}

}  // namespace redis
}  // namespace dynemb
