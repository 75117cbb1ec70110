// Router: nodes and slot map (redis_router.h).

#include "cc/core/redis/redis_router.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <mutex>

namespace dynemb {
namespace redis {
namespace {

ConnectOptions OptionsOf(const RedisConfig& c) {
  ConnectOptions o;
  o.user = c.redis_user;
  o.password = c.redis_password;
  o.db = c.mode() == ConnectionMode::kCluster ? 0 : c.redis_db;
  o.connect_timeout_ms = c.redis_connect_timeout;
  o.socket_timeout_ms = c.redis_socket_timeout;
  o.keep_alive = c.redis_connect_keep_alive;
  o.lifetime_ms = static_cast<int64_t>(c.redis_connection_lifetime) * 60 * 1000;
  return o;
}

std::vector<Endpoint> Seeds(const RedisConfig& c) {
  std::vector<Endpoint> seeds;
  for (size_t i = 0; i < c.redis_host_ip.size(); ++i) {
    seeds.push_back({c.redis_host_ip[i],
                     c.redis_host_port.size() == 1 ? c.redis_host_port[0] : c.redis_host_port[i]});
  }
  return seeds;
}

std::string Str(const redisReply* r) {
  if (r == nullptr) return "";
  if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_ERROR) {
    return std::string(r->str, r->len);
  }
  if (r->type == REDIS_REPLY_INTEGER) return std::to_string(r->integer);
  return "";
}

}  // namespace

Router::Router(const RedisConfig& config)
    : config_(config), options_(OptionsOf(config)),
      cluster_(config.mode() == ConnectionMode::kCluster) {}

NodePool* Router::PoolAt(const Endpoint& endpoint, bool read_only) {
  auto& pool = pools_[(read_only ? "readonly " : "") + endpoint.ToString()];
  if (pool == nullptr) {
    ConnectOptions options = options_;
    options.read_only = read_only;
    pool = std::make_unique<NodePool>(endpoint, options, config_.redis_conn_pool_size,
                                      config_.redis_wait_timeout);
  }
  return pool.get();
}

bool Router::AskSentinelReplica(Endpoint* replica) {
  ConnectOptions sentinel;
  sentinel.user = config_.redis_sentinel_user;
  sentinel.password = config_.redis_sentinel_password;
  sentinel.connect_timeout_ms = config_.redis_sentinel_connect_timeout;
  sentinel.socket_timeout_ms = config_.redis_sentinel_socket_timeout;
  for (const Endpoint& seed : Seeds(config_)) {
    std::unique_ptr<Connection> conn;
    if (!Connection::Open(seed, sentinel, &conn).ok()) continue;
    Command cmd;
    cmd.Add("SENTINEL"), cmd.Add("replicas"), cmd.Add(config_.redis_master_name);
    std::vector<Reply> replies;
    if (!conn->Pipeline({cmd}, &replies).ok()) continue;
    const redisReply* r = replies[0].get();
    if (r->type != REDIS_REPLY_ARRAY) continue;
    for (size_t i = 0; i < r->elements; ++i) {  // each: field, value, field, value, ...
      const redisReply* fields = r->element[i];
      if (fields->type != REDIS_REPLY_ARRAY) continue;
      std::map<std::string, std::string> f;
      for (size_t j = 0; j + 1 < fields->elements; j += 2) {
        f[Str(fields->element[j])] = Str(fields->element[j + 1]);
      }
      if (f["flags"] != "slave" || f["master-link-status"] != "ok") continue;  // down or syncing
      replica->host = f["ip"];
      replica->port = std::atoi(f["port"].c_str());
      return replica->port > 0;
    }
  }
  return false;
}

Status Router::AskSentinel(Endpoint* master, bool* not_a_sentinel) {
  *not_a_sentinel = false;
  ConnectOptions sentinel;
  sentinel.user = config_.redis_sentinel_user;
  sentinel.password = config_.redis_sentinel_password;
  sentinel.connect_timeout_ms = config_.redis_sentinel_connect_timeout;
  sentinel.socket_timeout_ms = config_.redis_sentinel_socket_timeout;
  Status last;
  for (const Endpoint& seed : Seeds(config_)) {
    std::unique_ptr<Connection> conn;
    last = Connection::Open(seed, sentinel, &conn);
    if (!last.ok()) continue;
    Command cmd;
    cmd.Add("SENTINEL"), cmd.Add("get-master-addr-by-name"), cmd.Add(config_.redis_master_name);
    std::vector<Reply> replies;
    last = conn->Pipeline({cmd}, &replies);
    if (!last.ok()) continue;
    const redisReply* r = replies[0].get();
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2) {
      master->host = Str(r->element[0]);
      master->port = std::atoi(Str(r->element[1]).c_str());
      return Status::Ok();
    }
    if (r->type == REDIS_REPLY_ERROR && Str(r).rfind("ERR unknown command", 0) == 0) {
      *not_a_sentinel = true;  // a Redis server, not a sentinel
    }
    last = Status(StatusCode::kUnavailable,
                  "the sentinel at " + seed.ToString() + " knows no master named '" +
                      config_.redis_master_name + "' (redis_master_name): " + Str(r));
  }
  return Status(StatusCode::kUnavailable,
                "no sentinel in redis_host_ip/redis_host_port named the master: " + last.message());
}

Status Router::Init() {
  std::unique_lock<std::shared_mutex> lock(mu_);
  std::vector<Reply> replies;
  Command ping;
  ping.Add("PING");
  if (config_.mode() == ConnectionMode::kSentinel) {
    Endpoint master;
    bool not_a_sentinel = false;
    const Status asked = AskSentinel(&master, &not_a_sentinel);
    if (asked.ok()) {
      single_ = read_single_ = PoolAt(master);
      Endpoint replica;
      if (config_.redis_read_access_slave && AskSentinelReplica(&replica)) {
        read_single_ = PoolAt(replica);  // a plain replica serves reads without READONLY
      }
      return single_->Run({ping}, &replies, true);
    }
    // As TFRA: when the host is a Redis server rather than a sentinel, it is
    // used as the server itself (TFRA's configs often omit
    // redis_connection_mode, whose default is sentinel, and name a standalone
    // server).
    if (!not_a_sentinel) return asked;
    single_ = read_single_ = PoolAt(Seeds(config_)[0]);
    const Status direct = single_->Run({ping}, &replies, true);
    if (direct.ok()) return direct;
    return Status(asked.code(), asked.message() + "; connecting to it as a Redis server failed too: " +
                                    direct.message());
  }
  if (!cluster_) {
    single_ = read_single_ = PoolAt(Seeds(config_)[0]);
    return single_->Run({ping}, &replies, true);
  }
  Status last;
  for (const Endpoint& seed : Seeds(config_)) {
    last = ReadSlots(PoolAt(seed));
    if (last.ok()) return last;
  }
  return last;
}

Status Router::ReadSlots(NodePool* seed) {
  Command cmd;
  cmd.Add("CLUSTER"), cmd.Add("SLOTS");
  std::vector<Reply> replies;
  DYNEMB_RETURN_IF_ERROR(seed->Run({cmd}, &replies, true));
  const redisReply* r = replies[0].get();
  if (r->type == REDIS_REPLY_ERROR) {
    return InvalidArgument("redis_connection_mode is 0 (cluster), but " + seed->endpoint().ToString() +
                           " answered CLUSTER SLOTS with: " + Str(r) +
                           " (use 2 for a standalone server)");
  }
  std::vector<NodePool*> slots(16384, nullptr), read_slots(16384, nullptr);
  std::map<std::string, std::pair<int, int>> first;  // per master: its lowest range
  for (size_t i = 0; i < r->elements; ++i) {
    const redisReply* range = r->element[i];
    if (range->type != REDIS_REPLY_ARRAY || range->elements < 3) continue;
    const int lo = static_cast<int>(range->element[0]->integer);
    const int hi = static_cast<int>(range->element[1]->integer);
    const redisReply* node = range->element[2];
    if (node->type != REDIS_REPLY_ARRAY || node->elements < 2) continue;
    Endpoint ep{Str(node->element[0]), static_cast<int>(node->element[1]->integer)};
    if (ep.host.empty()) ep.host = seed->endpoint().host;
    NodePool* pool = PoolAt(ep);
    // Replicas follow the master in the range's entry.
    NodePool* read_pool = pool;
    if (config_.redis_read_access_slave && range->elements > 3) {
      const redisReply* replica = range->element[3];
      if (replica->type == REDIS_REPLY_ARRAY && replica->elements >= 2) {
        Endpoint rep{Str(replica->element[0]), static_cast<int>(replica->element[1]->integer)};
        if (rep.host.empty()) rep.host = seed->endpoint().host;
        read_pool = PoolAt(rep, /*read_only=*/true);
      }
    }
    for (int s = std::max(lo, 0); s <= hi && s < 16384; ++s) slots[s] = pool, read_slots[s] = read_pool;
    auto it = first.find(ep.ToString());
    if (it == first.end() || lo < it->second.first) first[ep.ToString()] = {lo, hi};
  }
  for (int s = 0; s < 16384; ++s) {
    if (slots[s] == nullptr) {
      return Status(StatusCode::kUnavailable,
                    "the Redis cluster at " + seed->endpoint().ToString() + " serves no node for slot " +
                        std::to_string(s) + " (is the cluster fully created?)");
    }
  }
  slots_ = std::move(slots);
  read_slots_ = std::move(read_slots);
  first_ranges_.clear();
  for (const auto& kv : first) first_ranges_.push_back(kv.second);
  std::sort(first_ranges_.begin(), first_ranges_.end());
  return Status::Ok();
}

Status Router::Refresh() {
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (!cluster_) return Status::Ok();
  Status last;
  std::vector<NodePool*> seeds;
  for (auto& kv : pools_) seeds.push_back(kv.second.get());  // replicas answer CLUSTER SLOTS too
  for (NodePool* seed : seeds) {
    last = ReadSlots(seed);
    if (last.ok()) return last;
  }
  return last;
}

NodePool* Router::PoolFor(const std::string& bucket) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (!cluster_) return single_;
  return slots_[KeySlot(bucket)];
}

NodePool* Router::ReadPoolFor(const std::string& bucket) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (!cluster_) return read_single_;
  return read_slots_[KeySlot(bucket)];
}

std::vector<std::pair<int, int>> Router::MasterFirstRanges() {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return first_ranges_;
}

}  // namespace redis
}  // namespace dynemb
