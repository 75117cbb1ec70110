// Which node serves a bucket: one node (standalone, or the master a sentinel
// names) or the masters of a cluster by hash slot. See redis_table.h.

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
  // Re-reads the cluster's slot map (after a MOVED reply).
  Status Refresh();
  // Cluster: (first, last) slot of the first range of each master, sorted,
  // as TFRA derives its default hash tags from them.
  std::vector<std::pair<int, int>> MasterFirstRanges();

 private:
  NodePool* PoolAt(const Endpoint& endpoint);  // under mu_ (exclusive)
  Status ReadSlots(NodePool* seed);            // under mu_ (exclusive)
  // *not_a_sentinel: a host answered, but as a Redis server, not a sentinel.
  Status AskSentinel(Endpoint* master, bool* not_a_sentinel);

  const RedisConfig config_;
  const ConnectOptions options_;
  const bool cluster_;
  std::shared_mutex mu_;
  std::map<std::string, std::unique_ptr<NodePool>> pools_;
  NodePool* single_ = nullptr;           // standalone / sentinel
  std::vector<NodePool*> slots_;         // cluster: 16384 entries
  std::vector<std::pair<int, int>> first_ranges_;
};

}  // namespace redis
}  // namespace dynemb

#endif  // DYNEMB_CORE_REDIS_REDIS_ROUTER_H_
