// Streaming save and load of a Table to a byte stream, in chunks, so that a
// table larger than half the RAM can be saved: memory stays O(chunk_rows).
//
// Format (little-endian), version 1:
//   header:  "DYNEMB\0\1" | u32 version | u32 key_type | u32 value_type |
//            u32 reserved (0) | i64 dim
//   records: u64 n (> 0), then n rows, each: key | u64 score | values, where a
//            key is raw int32/int64 or (u32 length | bytes) for strings
//   footer:  u64 0 | u64 total rows written
// The footer's count detects truncation. Loading with clear_first reads the
// whole stream once before it clears the table, so a damaged or mismatched
// file leaves the table unchanged.

#ifndef DYNEMB_CORE_TABLE_IO_H_
#define DYNEMB_CORE_TABLE_IO_H_

#include <cstdint>
#include <vector>

#include "cc/core/table.h"

namespace dynemb {

// Writes every entry of `table` (keys, scores, values) to `sink` and closes it.
Status SaveTable(Table& table, int64_t chunk_rows, ByteSink* sink);

// How LoadTable reads its streams.
struct LoadOptions {
  int64_t chunk_rows = 65536;  // rows inserted per batch (memory stays O(chunk_rows))
  bool clear_first = true;     // replace the table's content instead of upserting
  // Keep only the entries with ShardOfKey(key, num_shards) == shard_index
  // (partition.h): how one shard of a variable loads the files a variable
  // with another number of shards saved. num_shards 1 keeps everything.
  int32_t num_shards = 1;
  int32_t shard_index = 0;
};

// Reads streams written by SaveTable into `table`, with their saved scores.
// The key type, value type and dim of each must match the table's (the error
// names both). With `clear_first`, every stream is validated to its footer
// and rewound, and only then is the table cleared and loaded: a damaged or
// mismatched file leaves the table unchanged.
Status LoadTable(const std::vector<ByteSource*>& sources, Table& table,
                 const LoadOptions& options, const Runner& runner);

}  // namespace dynemb

#endif  // DYNEMB_CORE_TABLE_IO_H_
