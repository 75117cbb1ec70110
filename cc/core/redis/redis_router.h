// Which node serves a bucket: one node (standalone, or the master a sentinel
// names) or the masters of a cluster by hash slot. See redis_table.h.
// With redis_read_access_slave (TFRA's field), reads may go to a replica
// instead: in a cluster, the first replica CLUSTER SLOTS lists for the slot
// (its connections send READONLY), else the master; under a sentinel, the
// first replica the sentinel lists as up, else the master; a standalone
// server has no replica to use. Replicas lag their master: such reads may
// return rows some writes old (TFRA's trade-off: for servers, not trainers).

#ifndef DYNEMB_CORE_REDIS_REDIS_ROUTER_H_
#define DYNEMB_CORE_REDIS_REDIS_ROUTER_H_

#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "cc/core/redis/redis_client.h"
#include "cc/core/redis/redis_config.h"

namespace dynemb {
namespace redis {

// Thread-safe. Pools live as long as the router.
class Router {
 public:
  explicit Router(const RedisConfig& config);
  // Connects (and, in cluster mode, reads the slot map; in sentinel mode,
  // asks for the master).
  Status Init();
  bool cluster() const { return cluster_; }
  // The pool of the node serving `bucket` (a key name).
  NodePool* PoolFor(const std::string& bucket);
  // The pool that serves reads of `bucket`: PoolFor's unless
  // redis_read_access_slave (above).
  NodePool* ReadPoolFor(const std::string& bucket);
  // Re-reads the cluster's slot map (after a MOVED reply).
  Status Refresh();
  // Cluster: (first, last) slot of the first range of each master, sorted,
  // as TFRA derives its default hash tags from them.
  std::vector<std::pair<int, int>> MasterFirstRanges();

 private:
  // Under mu_ (exclusive). `read_only`: a cluster replica's pool (READONLY).
  NodePool* PoolAt(const Endpoint& endpoint, bool read_only = false);
  Status ReadSlots(NodePool* seed);            // under mu_ (exclusive)
  // *not_a_sentinel: a host answered, but as a Redis server, not a sentinel.
  Status AskSentinel(Endpoint* master, bool* not_a_sentinel);
  // The first replica of the sentinel's master that is up; false if none.
  bool AskSentinelReplica(Endpoint* replica);

  const RedisConfig config_;
  const ConnectOptions options_;
  const bool cluster_;
  std::shared_mutex mu_;
  std::map<std::string, std::unique_ptr<NodePool>> pools_;
  NodePool* single_ = nullptr;           // standalone / sentinel
  NodePool* read_single_ = nullptr;      // its reads (redis_read_access_slave)
  std::vector<NodePool*> slots_;         // cluster: 16384 entries
  std::vector<NodePool*> read_slots_;    // their reads (redis_read_access_slave)
  std::vector<std::pair<int, int>> first_ranges_;
};

}  // namespace redis
}  // namespace dynemb

#endif  // DYNEMB_CORE_REDIS_REDIS_ROUTER_H_
