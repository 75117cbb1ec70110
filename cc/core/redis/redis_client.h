// A small Redis client over hiredis for redis_table.h: pipelined commands on
// pooled connections with timeouts, one reconnect-and-retry on a lost
// connection, and the cluster's slot map. See the design comment in
// redis_table.h. No TensorFlow dependency.

#ifndef DYNEMB_CORE_REDIS_REDIS_CLIENT_H_
#define DYNEMB_CORE_REDIS_REDIS_CLIENT_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/redis/redis_config.h"
#include "cc/core/table.h"

struct redisReply;
struct redisContext;

namespace dynemb {
namespace redis {

// One command as argv: views of bytes that must stay valid until the call
// that runs it returns.
struct Command {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  void Add(const void* data, size_t size) {
    argv.push_back(static_cast<const char*>(data));
    lens.push_back(size);
  }
  void Add(std::string_view s) { Add(s.data(), s.size()); }
  void Clear() { argv.clear(), lens.clear(); }
};

struct ReplyDeleter {
  void operator()(redisReply* reply) const;
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// How to connect and authenticate (from RedisConfig).
struct ConnectOptions {
  std::string user;
  std::string password;
  int db = 0;  // SELECTed unless 0 (clusters have only db 0)
  int connect_timeout_ms = 1000;
  int socket_timeout_ms = 1000;
  bool keep_alive = false;
  // A pooled connection older than this is closed when it is next released
  // or taken (redis_connection_lifetime); <= 0: kept while it works.
  int64_t lifetime_ms = 0;
  // Sends READONLY once connected: a cluster replica then serves reads of
  // its master's slots (redis_read_access_slave).
  bool read_only = false;
};

struct Endpoint {
  std::string host;
  int port = 0;
  std::string ToString() const { return host + ":" + std::to_string(port); }
};

// One connection. Not thread-safe (a pool hands it to one caller at a time).
class Connection {
 public:
  ~Connection();
  // Connects, authenticates and selects the db. kUnavailable when the server
  // cannot be reached in connect_timeout_ms; kInvalidArgument naming
  // redis_password / redis_user when AUTH is refused.
  static Status Open(const Endpoint& endpoint, const ConnectOptions& options,
                     std::unique_ptr<Connection>* out);
  // Sends every command, then reads every reply (one round trip for the
  // lot). An I/O error or timeout is kUnavailable and breaks the connection
  // (broken()); error replies are returned as replies, not as a status.
  Status Pipeline(const std::vector<Command>& commands, std::vector<Reply>* replies);
  bool broken() const { return broken_; }
  // Whether it has been open for `lifetime_ms` or longer (never when <= 0).
  bool expired(int64_t lifetime_ms) const;

 private:
  Connection(redisContext* context, Endpoint endpoint);
  redisContext* context_;
  Endpoint endpoint_;
  bool broken_ = false;
  std::string request_;  // the last pipeline's bytes, kept for its capacity
  const std::chrono::steady_clock::time_point opened_;
};

// The connections of one node: at most `max_size`, opened on demand, reused.
// Thread-safe.
class NodePool {
 public:
  NodePool(Endpoint endpoint, ConnectOptions options, int max_size, int wait_timeout_ms)
      : endpoint_(std::move(endpoint)), options_(std::move(options)), max_size_(max_size),
        wait_timeout_ms_(wait_timeout_ms) {}

  // Runs `commands` pipelined on one connection. When the connection turns
  // out to be lost (the server restarted, an idle connection was closed) and
  // `retry` is true, reconnects once and runs them again: only for commands
  // that may run twice (reads, HSET of fixed values, HDEL).
  Status Run(const std::vector<Command>& commands, std::vector<Reply>* replies, bool retry);
  const Endpoint& endpoint() const { return endpoint_; }

 private:
  Status Acquire(std::unique_ptr<Connection>* out);
  void Release(std::unique_ptr<Connection> conn);

  const Endpoint endpoint_;
  const ConnectOptions options_;
  const int max_size_;
  const int wait_timeout_ms_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Connection>> idle_;
  int open_ = 0;  // connections handed out or idle
};

// The error reply in `reply` (a REDIS_REPLY_ERROR) as a Status, or Ok. `what`
// names the command for the message. An out-of-memory reply (maxmemory) is
// kResourceExhausted; a node not serving now (CLUSTERDOWN, LOADING, TRYAGAIN,
// MASTERDOWN, BUSY) kUnavailable; a refused AUTH kInvalidArgument; others
// kInternal.
Status ReplyStatus(const redisReply* reply, const std::string& what);

// Whether `reply` is a cluster redirection (MOVED / ASK).
bool IsRedirect(const redisReply* reply);

// The cluster hash slot of a key (CRC16 of its hash tag, as Redis computes it).
int KeySlot(std::string_view key);

// The smallest non-negative integer whose decimal string has hash slot
// `slot`: TFRA's hash tags for its buckets are these numbers.
int SlotTagNumber(int slot);

}  // namespace redis
}  // namespace dynemb

#endif  // DYNEMB_CORE_REDIS_REDIS_CLIENT_H_
