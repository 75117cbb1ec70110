// The hiredis side of redis_client.h.

#include "cc/core/redis/redis_client.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <charconv>
#include <chrono>
#include <cstring>
#include <string>
#include <mutex>
#include <utility>

namespace dynemb {
namespace redis {
namespace {

timeval Millis(int ms) {
  timeval tv;
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  return tv;
}

Status Unavailable(std::string msg) { return Status(StatusCode::kUnavailable, std::move(msg)); }

std::string ContextError(const redisContext* c) {
  if (c == nullptr) return "out of memory";
  std::string err = c->errstr;
  if (c->err == REDIS_ERR_IO && err.find("Resource temporarily unavailable") != std::string::npos) {
    err = "timed out (" + err + ")";
  }
  return err.empty() ? std::string("connection lost") : err;
}

// Runs one command and returns its reply (nullptr with *status set on I/O error).
Reply RunOne(redisContext* c, const Endpoint& endpoint, const ConnectOptions& options,
             std::initializer_list<std::string_view> args, Status* status) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (std::string_view a : args) argv.push_back(a.data()), lens.push_back(a.size());
  void* raw = redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data());
  if (raw == nullptr) {
    *status = Unavailable("Redis at " + endpoint.ToString() +
                          " (redis_host_ip/redis_host_port) did not answer " + std::string(*args.begin()) +
                          " within redis_socket_timeout " + std::to_string(options.socket_timeout_ms) +
                          " ms: " + ContextError(c));
  }
  return Reply(static_cast<redisReply*>(raw));
}

}  // namespace

void ReplyDeleter::operator()(redisReply* reply) const { freeReplyObject(reply); }

Connection::~Connection() {
  if (context_ != nullptr) redisFree(context_);
}

Status Connection::Open(const Endpoint& endpoint, const ConnectOptions& options,
                        std::unique_ptr<Connection>* out) {
  redisContext* c =
      redisConnectWithTimeout(endpoint.host.c_str(), endpoint.port, Millis(options.connect_timeout_ms));
  if (c == nullptr || c->err) {
    const std::string err = ContextError(c);
    if (c != nullptr) redisFree(c);
    return Unavailable("cannot connect to Redis at " + endpoint.ToString() +
                       " (redis_host_ip/redis_host_port, redis_connect_timeout " +
                       std::to_string(options.connect_timeout_ms) + " ms): " + err);
  }
  std::unique_ptr<Connection> conn(new Connection(c, endpoint));
  if (redisSetTimeout(c, Millis(options.socket_timeout_ms)) != REDIS_OK) {
    return Unavailable("cannot set the socket timeout on " + endpoint.ToString() + ": " +
                       ContextError(c));
  }
  if (options.keep_alive) redisEnableKeepAlive(c);
  Status status;
  if (!options.password.empty()) {
    // Redis 6 ACLs: AUTH user password; "default" with AUTH password also
    // works on servers without ACLs (Redis 5).
    Reply reply = options.user.empty() || options.user == "default"
                      ? RunOne(c, endpoint, options, {"AUTH", options.password}, &status)
                      : RunOne(c, endpoint, options, {"AUTH", options.user, options.password}, &status);
    DYNEMB_RETURN_IF_ERROR(status);
    if (reply->type == REDIS_REPLY_ERROR) {
      return InvalidArgument("Redis at " + endpoint.ToString() + " refused AUTH of redis_user '" +
                             options.user + "' with the configured redis_password: " +
                             std::string(reply->str, reply->len));
    }
  }
  Reply ping = RunOne(c, endpoint, options, {"PING"}, &status);
  DYNEMB_RETURN_IF_ERROR(status);
  if (ping->type == REDIS_REPLY_ERROR) {
    const std::string err(ping->str, ping->len);
    if (err.rfind("NOAUTH", 0) == 0) {
      return InvalidArgument("Redis at " + endpoint.ToString() +
                             " requires a password, and redis_password is empty: " + err);
    }
    return Unavailable("Redis at " + endpoint.ToString() + " answered PING with: " + err);
  }
  if (options.read_only) {
    Reply reply = RunOne(c, endpoint, options, {"READONLY"}, &status);
    DYNEMB_RETURN_IF_ERROR(status);
    if (reply->type == REDIS_REPLY_ERROR) {
      return Unavailable("the Redis cluster replica at " + endpoint.ToString() +
                         " refused READONLY (redis_read_access_slave): " +
                         std::string(reply->str, reply->len));
    }
  }
  if (options.db != 0) {
    Reply reply = RunOne(c, endpoint, options, {"SELECT", std::to_string(options.db)}, &status);
    DYNEMB_RETURN_IF_ERROR(status);
    if (reply->type == REDIS_REPLY_ERROR) {
      return InvalidArgument("Redis at " + endpoint.ToString() + " refused redis_db " +
                             std::to_string(options.db) + ": " + std::string(reply->str, reply->len));
    }
  }
  *out = std::move(conn);
  return Status::Ok();
}

namespace {

// Appends `n` in decimal and "\r\n".
void AppendNumberLine(std::string* out, size_t n) {
  char digits[24];
  const auto end = std::to_chars(digits, digits + sizeof(digits), n).ptr;
  out->append(digits, end);
  out->append("\r\n", 2);
}

// The commands in Redis's protocol (RESP arrays of bulk strings), one buffer
// for the lot: hiredis would format each argument with sdscatfmt and then
// copy the command again (a sixth of a lookup's client CPU, perf).
void FormatCommands(const std::vector<Command>& commands, std::string* out) {
  size_t bytes = 0;
  for (const Command& cmd : commands) {
    bytes += 16;
    for (size_t len : cmd.lens) bytes += len + 16;
  }
  out->clear();
  out->reserve(bytes);
  for (const Command& cmd : commands) {
    out->push_back('*');
    AppendNumberLine(out, cmd.argv.size());
    for (size_t a = 0; a < cmd.argv.size(); ++a) {
      out->push_back('$');
      AppendNumberLine(out, cmd.lens[a]);
      out->append(cmd.argv[a], cmd.lens[a]);
      out->append("\r\n", 2);
    }
  }
}

}  // namespace

Status Connection::Pipeline(const std::vector<Command>& commands, std::vector<Reply>* replies) {
  replies->clear();
  replies->reserve(commands.size());
  FormatCommands(commands, &request_);
  if (redisAppendFormattedCommand(context_, request_.data(), request_.size()) != REDIS_OK) {
    broken_ = true;
    return Unavailable("Redis at " + endpoint_.ToString() + ": " + ContextError(context_));
  }
  for (size_t i = 0; i < commands.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(context_, &raw) != REDIS_OK || raw == nullptr) {
      broken_ = true;
      return Unavailable("lost the connection to Redis at " + endpoint_.ToString() +
                         " (redis_socket_timeout applies): " + ContextError(context_));
    }
    replies->emplace_back(static_cast<redisReply*>(raw));
  }
  return Status::Ok();
}

Connection::Connection(redisContext* context, Endpoint endpoint)
    : context_(context), endpoint_(std::move(endpoint)), opened_(std::chrono::steady_clock::now()) {}

bool Connection::expired(int64_t lifetime_ms) const {
  return lifetime_ms > 0 &&
         std::chrono::steady_clock::now() - opened_ >= std::chrono::milliseconds(lifetime_ms);
}

Status NodePool::Acquire(std::unique_ptr<Connection>* out) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_timeout_ms_);
    while (idle_.empty() && open_ >= max_size_) {
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && idle_.empty() &&
          open_ >= max_size_) {
        return Unavailable("no free connection to Redis at " + endpoint_.ToString() + " within " +
                           std::to_string(wait_timeout_ms_) + " ms (redis_wait_timeout; " +
                           std::to_string(max_size_) + " connections, redis_conn_pool_size)");
      }
    }
    if (!idle_.empty()) {
      *out = std::move(idle_.back());
      idle_.pop_back();
      if (!(*out)->expired(options_.lifetime_ms)) return Status::Ok();
      out->reset();  // past redis_connection_lifetime: replaced by a new one below
    } else {
      ++open_;  // reserve a slot, connect outside the lock
    }
  }
  Status status = Connection::Open(endpoint_, options_, out);
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    --open_;
    cv_.notify_one();
  }
  return status;
}

void NodePool::Release(std::unique_ptr<Connection> conn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (conn->broken() || conn->expired(options_.lifetime_ms)) {
    --open_;
  } else {
    idle_.push_back(std::move(conn));
  }
  cv_.notify_one();
}

Status NodePool::Run(const std::vector<Command>& commands, std::vector<Reply>* replies, bool retry) {
  for (int attempt = 0;; ++attempt) {
    std::unique_ptr<Connection> conn;
    DYNEMB_RETURN_IF_ERROR(Acquire(&conn));
    Status status = conn->Pipeline(commands, replies);
    const bool broken = conn->broken();
    Release(std::move(conn));
    if (status.ok() || !broken || !retry || attempt > 0) return status;
    // A pooled connection the server closed meanwhile (restart, timeout):
    // drop every idle one, they are likely dead too, and try once more.
    std::lock_guard<std::mutex> lock(mu_);
    open_ -= static_cast<int>(idle_.size());
    idle_.clear();
  }
}

Status ReplyStatus(const redisReply* reply, const std::string& what) {
  if (reply == nullptr) return Status(StatusCode::kInternal, what + ": no reply");
  if (reply->type != REDIS_REPLY_ERROR) return Status::Ok();
  const std::string err(reply->str, reply->len);
  if (err.rfind("OOM", 0) == 0) {
    return Status(StatusCode::kResourceExhausted,
                  what + " failed: Redis is full (its maxmemory is reached and its policy evicts "
                         "nothing): " + err);
  }
  for (const char* transient : {"CLUSTERDOWN", "LOADING", "TRYAGAIN", "MASTERDOWN", "BUSY"}) {
    if (err.rfind(transient, 0) == 0) {
      return Status(StatusCode::kUnavailable, what + " failed: Redis is not serving now: " + err);
    }
  }
  if (err.rfind("NOAUTH", 0) == 0 || err.rfind("WRONGPASS", 0) == 0) {
    return InvalidArgument(what + " failed: check redis_user / redis_password: " + err);
  }
  return Status(StatusCode::kInternal, what + " failed: Redis answered: " + err);
}

bool IsRedirect(const redisReply* reply) {
  return reply != nullptr && reply->type == REDIS_REPLY_ERROR &&
         (std::strncmp(reply->str, "MOVED ", 6) == 0 || std::strncmp(reply->str, "ASK ", 4) == 0);
}

namespace {
uint16_t Crc16(std::string_view s) {  // CRC16-CCITT (XMODEM), as Redis Cluster uses
  uint16_t crc = 0;
  for (unsigned char c : s) {
    crc ^= static_cast<uint16_t>(c) << 8;
    for (int i = 0; i < 8; ++i) crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                                                     : static_cast<uint16_t>(crc << 1);
  }
  return crc;
}
}  // namespace

int KeySlot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return Crc16(key) & 16383;
}

int SlotTagNumber(int slot) {
  // Computed once: the first integer whose decimal string falls in each slot
  // (all 16384 slots are covered below 110,000).
  static const std::vector<int>* table = [] {
    auto* t = new std::vector<int>(16384, -1);
    int left = 16384;
    for (int i = 0; left > 0; ++i) {
      const int s = Crc16(std::to_string(i)) & 16383;
      if ((*t)[s] < 0) (*t)[s] = i, --left;
    }
    return t;
  }();
  return (*table)[slot & 16383];
}

}  // namespace redis
}  // namespace dynemb
