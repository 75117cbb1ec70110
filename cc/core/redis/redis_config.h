// The configuration of a Redis-backed table (redis_table.h): every field of
// TFRA's RedisTableConfig JSON file, with TFRA's names and defaults, and the
// parser of that file. No TensorFlow dependency.

#ifndef DYNEMB_CORE_REDIS_REDIS_CONFIG_H_
#define DYNEMB_CORE_REDIS_REDIS_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/table.h"

namespace dynemb {
namespace redis {

// TFRA's redis_connection_mode values.
enum class ConnectionMode : int { kCluster = 0, kSentinel = 1, kStandalone = 2 };

// Fields, names and defaults as TFRA's (its Redis_Connection_Params); the
// comments say what this implementation does with each.
struct RedisConfig {
  int redis_connection_mode = 1;               // 0 cluster, 1 sentinel, 2 standalone
  std::string redis_master_name = "master";    // sentinel: the master's name
  std::vector<std::string> redis_host_ip = {"127.0.0.1"};
  std::vector<int> redis_host_port = {6379};   // one per host (or one for all)
  std::string redis_user = "default";
  std::string redis_password;                  // empty: no AUTH
  int redis_db = 0;                            // SELECT (not in cluster mode)
  bool redis_read_access_slave = false;        // lookups read replicas (redis_router.h)
  bool redis_connect_keep_alive = false;       // TCP keep-alive
  int redis_connect_timeout = 1000;            // ms
  int redis_socket_timeout = 1000;             // ms, per read/write
  int redis_conn_pool_size = 20;               // connections per node, at most
  int redis_wait_timeout = 100000000;          // ms to wait for a free connection
  int redis_connection_lifetime = 100;         // minutes a pooled connection lives; <= 0: no limit
  std::string redis_sentinel_user = "default";
  std::string redis_sentinel_password;
  int redis_sentinel_connect_timeout = 1000;   // ms
  int redis_sentinel_socket_timeout = 1000;    // ms
  int storage_slice_import = -1;               // -1 (or <= 0): storage_slice
  int storage_slice = 1;                       // buckets (hashes) per table
  bool using_hash_storage_slice = false;       // bucket by CRC32C of numeric keys
  int64_t keys_sending_size = 1024;            // keys per command
  bool using_md5_prefix_name = false;          // prefix = MD5(model_tag:name)
  bool redis_hash_tags_hypodispersion = false; // cluster: tags spread over 16384 slots
  std::string model_tag_import = "test";
  std::vector<std::string> redis_hash_tags_import;
  std::string model_tag_runtime = "test";
  std::vector<std::string> redis_hash_tags_runtime;
  int expire_model_tag_in_seconds = 604800;    // EXPIRE on close; <= 0: never
  int table_store_mode = 1;                    // 0: in the TF checkpoint, 1: files, 2: nothing
  std::string model_lib_abs_dir = "/tmp/";

  ConnectionMode mode() const { return static_cast<ConnectionMode>(redis_connection_mode); }
  // Checks every field's range; the message names the field and the value.
  Status Validate() const;
};

// Parses a config JSON document (TFRA's file format: one object; unknown
// fields are ignored, as TFRA does) into *config, over its defaults.
// `source` (a path) prefixes error messages, which name the field, the
// value received and what was expected, or the offset of a syntax error.
Status ParseRedisConfig(std::string_view json, const std::string& source, RedisConfig* config);

// Reads and parses the file at `path` (kNotFound when it cannot be read).
Status LoadRedisConfigFile(const std::string& path, RedisConfig* config);

}  // namespace redis
}  // namespace dynemb

#endif  // DYNEMB_CORE_REDIS_REDIS_CONFIG_H_
