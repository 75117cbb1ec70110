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

#include "cc/core/table.h"

namespace dynemb {

// Writes every entry of `table` (keys, scores, values) to `sink` and closes it.
Status SaveTable(Table& table, int64_t chunk_rows, ByteSink* sink);

// Reads a stream written by SaveTable into `table`, inserting at most
// `chunk_rows` rows per batch, with their saved scores. The key type, value
// type and dim must match the table's (the error names both). With
// `clear_first`, the stream is validated to its footer, rewound, and only
// then is the table cleared and loaded.
Status LoadTable(ByteSource* source, Table& table, int64_t chunk_rows, bool clear_first,
                 const Runner& runner);

}  // namespace dynemb

#endif  // DYNEMB_CORE_TABLE_IO_H_
