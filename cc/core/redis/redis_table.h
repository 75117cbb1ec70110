// tensorflow_dynemb core: a Table (cc/core/table.h) whose rows live in a
// Redis server or cluster, laid out as TFRA's RedisTable lays them out, so
// that either library reads what the other wrote. Built only where hiredis is
// found (setup.py); no TensorFlow dependency.
//
// ============================================================================
// Design
// ============================================================================
//
// Key layout (TFRA's, see docs/tables.md "Redis")
//   A table is `storage_slice` Redis hashes ("buckets") named
//       <model_tag_runtime>:<embedding_name>{<tag>}
//   where embedding_name is the table's name up to its first "_mht_" (a
//   de.Variable's shards are named <variable>_mht_<i>of<n>, so they share
//   their variable's buckets, as in TFRA), and <tag> is the i-th entry of
//   redis_hash_tags_runtime when that list has storage_slice entries, else a
//   number whose decimal string hashes to a chosen cluster slot (TFRA's
//   table, computed here: SlotTagNumber). With using_md5_prefix_name the
//   "<model_tag>:<name>" part is replaced by its 16 raw MD5 bytes.
//   In a bucket, the field is the key's bytes (int32/int64: little-endian
//   raw bytes; strings: the bytes) and the value the row's raw bytes
//   (dim elements of the value type, little-endian), exactly TFRA's format.
//   Which bucket holds a key: in cluster mode, numeric keys by
//   (uint32)(key) % storage_slice (CRC32C of the bytes with
//   using_hash_storage_slice), string keys by TFRA's CRC32C of the first
//   size bytes of TF's tstring object: for strings of up to 22 bytes
//   (stored inline) the byte size << 2 and the first size - 1 bytes; longer
//   strings (whose object holds a pointer, so TFRA's bucket depends on the
//   string's address) by CRC32C of their bytes. In standalone and sentinel
//   mode TFRA writes every key to the first bucket, and so do we.
//   Redis keeps no scores: rows export with score 0, and the table never
//   evicts (Redis' own maxmemory policy may; see Errors).
//
// Rehash on open (redis_table_rehash.cc)
//   As TFRA: when model_tag_import equals model_tag_runtime and the import
//   layout (storage_slice_import buckets named by redis_hash_tags_import)
//   differs from the runtime one, opening the table moves every row of the
//   import buckets whose runtime bucket is another one there (HSCAN, then
//   HSETNX into the runtime bucket, then HDEL from the old one). A row already
//   in its runtime bucket wins; a failure midway leaves a row in both, never
//   in neither, and the next open finishes the move. (TFRA copies the rows
//   but leaves those of a bucket name both layouts share in place, so a key
//   can be counted twice; here each row ends in one bucket.) Every shard of a
//   variable opens its table, so several may move at once: each step is
//   idempotent. With storage_slice_import unset (-1) the layouts are the
//   same and nothing moves: set it to the old storage_slice when changing.
//
// Batches and pipelining
//   A batch is grouped by (bucket, lane): lane = a hash of the key modulo the
//   number of lanes (about one per 4 commands' worth of keys, at most
//   redis_conn_pool_size and 8). Each group is sent as commands of at most
//   keys_sending_size keys (HMGET / HSET / HDEL / one EVAL for accum), all of a
//   group pipelined on one pooled connection: one round trip per group, not
//   per key or per command. Groups run in parallel on the op's Runner. Every
//   row of a key is in one group, in batch order, on one connection, so a
//   batch keeps the sequential semantics of table.h (last insert wins, accum
//   deltas add up, ApplyRule sees the state the previous row left).
//   Accum runs a Lua script per command (HGET, add elementwise, HSET), atomic
//   per command on the server as TFRA's HMACCUM module command is, without
//   needing that module. ApplyRule reads the state rows (HMGET), updates
//   them here (update_rules.h) and writes them back (HSET): a concurrent
//   writer of the same key in another process may be overwritten.
//
// Connections (redis_client.h)
//   One NodePool per node: up to redis_conn_pool_size connections, opened on
//   demand and reused; a caller waits at most redis_wait_timeout for one.
//   A connection open for redis_connection_lifetime minutes is closed when it
//   is next released or taken, and a new one opened (as TFRA's client does).
//   Connecting is bounded by redis_connect_timeout, each read and write by
//   redis_socket_timeout: a dead or stopped server is an error after at most
//   those, never a hang. A pooled connection found broken is replaced and
//   the commands are sent once more, for reads and idempotent writes only
//   (HMGET, HSET, HDEL, HLEN, DEL; never accum, which could add twice).
//   Cluster mode reads CLUSTER SLOTS from the first reachable seed, routes
//   each bucket (all of a bucket's commands share its hash tag, so one slot)
//   to its master, and on a MOVED/ASK reply re-reads the map and re-sends the
//   group once. Sentinel mode asks the sentinels (redis_host_ip/port) for
//   redis_master_name's address, then connects there.
//
// Errors (Status codes, which the kernels map to TF's errors)
//   kUnavailable: a node cannot be reached, timed out, or went away, or no
//     pooled connection freed up in time; the message names the address and
//     the config field that bounds the wait.
//   kInvalidArgument: AUTH refused (names redis_user / redis_password), a bad
//     config field (redis_config.h), rows in Redis of another width than
//     this table's dim and dtype.
//   kResourceExhausted: Redis refused a write at its maxmemory (OOM reply,
//     under the noeviction policy). Under an evicting policy Redis drops
//     whole buckets silently: that is Redis' choice, documented.
//   Size() and Clear() cannot report errors through the Table interface:
//   CheckedSize / CheckedClear do (the kernels call those).
//
// Thread safety: every method is thread-safe; counters are atomics.
// ============================================================================

#ifndef DYNEMB_CORE_REDIS_REDIS_TABLE_H_
#define DYNEMB_CORE_REDIS_REDIS_TABLE_H_

#include <memory>
#include <string>
#include <vector>

#include "cc/core/redis/redis_config.h"
#include "cc/core/table.h"

namespace dynemb {
namespace redis {

// The names of the buckets a table of `embedding_name` uses under `config`
// at runtime (model_tag_runtime, redis_hash_tags_runtime), given the first
// slot of each master node's first range (cluster mode; empty otherwise or
// with redis_hash_tags_hypodispersion).
std::vector<std::string> BucketNames(const RedisConfig& config, const std::string& embedding_name,
                                     const std::vector<std::pair<int, int>>& cluster_ranges);

// The part of a table name that names its buckets: up to the first "_mht_".
std::string EmbeddingName(const std::string& table_name);

// Connects to the Redis of `config` and returns a table over the buckets of
// `embedding_name` (options: key and value type, dim; capacities and
// eviction are not used). Returns nullptr and sets *status when the config
// is invalid or the server cannot be reached.
std::unique_ptr<Table> NewRedisTable(const TableOptions& options, const RedisConfig& config,
                                     const std::string& embedding_name, Status* status);

}  // namespace redis
}  // namespace dynemb

#endif  // DYNEMB_CORE_REDIS_REDIS_TABLE_H_
