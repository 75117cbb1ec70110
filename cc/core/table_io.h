// Streaming save and load of a Table to a byte stream, in chunks, so that a
// table larger than half the RAM can be saved: memory stays O(chunk_rows).
//
// Format version 2 (little-endian), written by SaveTable:
//   header (64 bytes):
//     "DYNEMB\0\1" | u32 version (2) | u32 key_type | u32 value_type | u32 flags |
//     i64 dim | char save_id[16] | i32 shard_index | i32 num_shards | u32 0 |
//     u32 masked CRC32C of the 60 bytes before it
//   blocks, each:
//     u64 rows (> 0) | u64 payload bytes | u32 masked CRC32C of the payload |
//     u32 masked CRC32C of the 20 bytes before it | payload: `rows` rows, each
//     key | u64 score | values, where a key is raw int32/int64 or
//     (u32 length | bytes) for strings
//   footer: a block of 0 rows whose 16-byte payload is
//     u64 total rows | u32 digest | u32 0; nothing follows it.
// Format version 3 is version 2 with two more flags, which choose the row
// layout (a file without them is still written as version 2, so older builds
// read it): bit 1 (kNoScoresFlag) rows are key | values, no score (delta rows:
// serving needs no scores); bit 2 (kKeysOnlyFlag, always with bit 1) rows are
// keys only (a delta's tombstones: keys to remove). LoadTable upserts rows
// without scores as an insert would (the table scores them) and removes the
// keys of a keys-only file.
// flags bit 0 (kRoutedFlag): every key k of the file has
// ShardOfKey(k, num_shards) == shard_index (partition.h), so a load can check
// that each key sits in the shard that owns it. `save_id` names the save
// (generation, cc/core/generation.h) the file belongs to; a file saved on its
// own has one too. The digest is the CRC32C of the header and of every
// block's 24-byte head in order (payloads enter through their CRCs): one
// number for the whole content, which a manifest records.
//
// Every block is checked before any of its rows is used: a flipped bit, a
// truncation or a block from another file is kDataLoss naming the stream
// and the byte offset. Version 1 files (header "DYNEMB\0\1" | u32 1 | ...,
// records without checksums, a footer with the row count) are still read;
// only their truncation is detectable.

#ifndef DYNEMB_CORE_TABLE_IO_H_
#define DYNEMB_CORE_TABLE_IO_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cc/core/table.h"

namespace dynemb {

// The format versions LoadTable reads, and the one SaveTable writes.
constexpr uint32_t kTableFileVersion = 3;
constexpr uint32_t kOldestTableFileVersion = 1;
// Characters of a save id (lowercase hex).
constexpr size_t kSaveIdChars = 16;
constexpr uint32_t kRoutedFlag = 1;
constexpr uint32_t kNoScoresFlag = 2;
constexpr uint32_t kKeysOnlyFlag = 4;
// The flags that make a file version 3.
constexpr uint32_t kVersion3Flags = kNoScoresFlag | kKeysOnlyFlag;

// How SaveTable writes one file.
struct SaveOptions {
  int64_t chunk_rows = 65536;  // rows read from the table at a time
  std::string save_id;         // kSaveIdChars characters; empty: all '0'
  int32_t shard_index = 0;     // which shard of a variable the file holds
  int32_t num_shards = 1;
  bool routed = false;  // the keys are routed by ShardOfKey (sets kRoutedFlag)
  bool with_scores = true;  // false: rows are key | values (kNoScoresFlag)
  bool keys_only = false;   // rows are keys (kKeysOnlyFlag); needs with_scores false
};

// What SaveTable wrote (a manifest's record of the file).
struct SavedFile {
  uint64_t rows = 0;
  uint64_t bytes = 0;
  uint32_t digest = 0;
};

// Writes every entry of `table` (keys, scores, values) to `sink` in format
// version 2 and closes the sink; fills *saved (nullable).
Status SaveTable(Table& table, const SaveOptions& options, ByteSink* sink, SavedFile* saved);

// SaveTable with default options but `chunk_rows`.
Status SaveTable(Table& table, int64_t chunk_rows, ByteSink* sink);

// The changes of `table` in the window [since, until) (Table::ExportChanges)
// as two files: the rows written in it (key | values, kNoScoresFlag) to
// `rows`, the keys removed in it (kKeysOnlyFlag) to `removed`; `options`
// says the rest (save id, shard, routing, chunk_rows). Sets *complete false
// when the window's changes are not all known: then the sinks hold part of
// the rows and are not closed (the caller discards them) and nothing else is
// filled.
Status SaveChanges(Table& table, const ChangeMark& since, const ChangeMark& until,
                   const SaveOptions& options, ByteSink* rows, ByteSink* removed,
                   SavedFile* rows_saved, SavedFile* removed_saved, bool* complete);

// Writes n given rows (keys in the batch representation of `table`'s key
// type, values [n, dim], scores [n] unless the layout has none) as one file
// of a table of options `table`, and closes the sink.
Status SaveRows(const TableOptions& table, const SaveOptions& options, const void* keys,
                int64_t n, const void* values, const uint64_t* scores, ByteSink* sink,
                SavedFile* saved);

// What a load expects of one stream (from a manifest); the load fails with
// kDataLoss, naming the stream and both values, when the stream differs.
struct ExpectedFile {
  std::string save_id;
  int32_t shard_index = 0;
  int32_t num_shards = 1;
  uint64_t rows = 0;
  uint64_t bytes = 0;
  uint32_t digest = 0;
};

// How LoadTable reads its streams.
struct LoadOptions {
  int64_t chunk_rows = 65536;  // rows inserted per batch (memory stays O(chunk_rows))
  bool clear_first = true;     // replace the table's content instead of upserting
  // Keep only the entries with ShardOfKey(key, num_shards) == shard_index
  // (partition.h): how one shard of a variable loads the files a variable
  // with another number of shards saved. num_shards 1 keeps everything.
  int32_t num_shards = 1;
  int32_t shard_index = 0;
  // Instead of skipping the keys of other shards, treat one as damage
  // (kDataLoss): the streams claim to hold exactly this shard's keys.
  bool verify_routing = false;
  // Read every stream through (every check made) before the table is
  // changed; with clear_first, only then is the table cleared. false: the
  // caller checked the streams before, or loads into a table it will drop on
  // failure (a staged load).
  bool validate_first = true;
  // Per stream (empty, or one per stream): what it must be.
  std::vector<ExpectedFile> expected;
  // Where rows go instead of the table (rows already filtered by shard):
  // keys, n, values (null for removals), scores (null where the file has
  // none), and whether the rows are keys to remove (a keys-only file). Also
  // called by CheckTableFiles, which has no table.
  std::function<Status(const void* keys, int64_t n, const void* values, const uint64_t* scores,
                       bool removal)>
      consumer;
};

// What LoadTable read, per stream.
struct LoadedFile {
  uint32_t version = 0;
  std::string save_id;  // empty for version 1
  int32_t shard_index = 0;
  int32_t num_shards = 1;
  bool routed = false;
  uint32_t flags = 0;  // the header's (the row layout: kNoScoresFlag, kKeysOnlyFlag)
  uint64_t rows = 0;
};

// Reads streams written by SaveTable into `table`, with their saved scores.
// The key type, value type and dim of each must match the table's (the error
// names both). With validate_first, every stream is checked to its end and
// rewound before the table is changed, so a damaged or mismatched stream
// leaves the table unchanged. `loaded` (nullable) receives one LoadedFile per
// stream.
Status LoadTable(const std::vector<ByteSource*>& sources, Table& table,
                 const LoadOptions& options, const Runner& runner,
                 std::vector<LoadedFile>* loaded = nullptr);

// Reads every stream through and checks it as LoadTable would, changing no
// table: what a load checks before it changes anything.
Status CheckTableFiles(const std::vector<ByteSource*>& sources, const TableOptions& table,
                       const LoadOptions& options, std::vector<LoadedFile>* loaded = nullptr);

}  // namespace dynemb

#endif  // DYNEMB_CORE_TABLE_IO_H_
