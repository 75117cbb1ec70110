// Delta generations: the files one write of a DeltaExporter makes
// (tensorflow_dynemb/serving/delta_exporter.py; docs/online_learning.md), and
// the manifest that makes them one.
//
// A directory holds one base and the deltas that follow it. Each write is a
// generation in the sense of generation.h: data files named with the write's
// save id (table_io.h format), synced, then a manifest written aside, synced
// and renamed into place (the commit). Its name orders it:
//   delta-<base serial, 6 digits>-<sequence, 8 digits>.dynemb-delta
// Sequence 0 is a base (every table whole); 1, 2, ... are deltas of that
// base. A new base (a rebase) takes the next serial; once its manifest is in
// place the writer deletes the older serials' files. A reader applies
// sequence k only after k - 1, and only to a state that came from the same
// base (its id is in every manifest): a gap or another base's delta is an
// error, never silent drift.
//
// Data files: delta-<serial>-<sequence>-<item, 4 digits>-<role>-<shard, 5
// digits>.<save id>.dynemb, where role is
//   full     a whole table (SaveTable: key | score | values)
//   rows     rows written in the window (SaveChanges: key | values)
//   removed  keys removed or evicted in the window (SaveChanges: keys only)
//   dense    a dense variable: one row, key 0, dim = its element count
//
// The manifest is text, one field per line, and ends with the CRC32C of the
// bytes before its last line (as generation.h's):
//   tensorflow_dynemb delta 1
//   base_id 3f0c9a61d2b47e85
//   base_serial 1
//   sequence 4
//   save_id 9a0e5b7711c2d4f3
//   table item%2Femb - int64 float32 8 default 2 delta
//   dense dense_1%2Fkernel variables%2F3 float32 16x1
//   file 0 rows 0 delta-000001-00000004-0000-rows-00000.9a0e5b7711c2d4f3.dynemb 1234 20 a1b2c3d4
//   file 0 removed 0 ...
//   crc 5d41402a
// Items are numbered in the order of their lines. A table item (a
// de.Variable of num_shards shard tables, or a table: 1 shard) is `replace`
// (one full file per shard: its content becomes exactly that) or `delta`
// (one rows and one removed file per shard: removed keys go, then rows are
// upserted). A dense item has one dense file and is always replaced. The
// identities (URL-quoted, so without spaces; "-" for none) say which
// object of a model an item is: a reader matches either one.

#ifndef DYNEMB_CORE_DELTA_H_
#define DYNEMB_CORE_DELTA_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/table.h"

namespace dynemb {

constexpr char kDeltaManifestSuffix[] = ".dynemb-delta";
constexpr int kDeltaManifestVersion = 1;

enum class DeltaRole : int { kFull = 0, kRows = 1, kRemoved = 2, kDense = 3 };
const char* DeltaRoleName(DeltaRole role);
bool ParseDeltaRole(std::string_view name, DeltaRole* role);

struct DeltaFile {
  int32_t item = 0;
  DeltaRole role = DeltaRole::kFull;
  int32_t shard = 0;
  std::string name;  // relative to the manifest's directory
  uint64_t bytes = 0;
  uint64_t rows = 0;
  uint32_t digest = 0;
};

struct DeltaItem {
  bool dense = false;
  std::string identity;  // URL-quoted; never empty
  std::string alt;       // URL-quoted, or empty (written "-")
  KeyType key_type = KeyType::kInt64;       // tables
  ValueType value_type = ValueType::kFloat32;
  int64_t dim = 1;                          // tables: elements per row
  std::string partitioner = "default";      // tables: "default" or "custom"
  int32_t num_shards = 1;                   // tables
  bool replace = true;                      // tables: full files or changes
  std::vector<int64_t> shape;               // dense: the variable's shape
};

struct DeltaManifest {
  std::string base_id;
  uint64_t base_serial = 0;
  uint64_t sequence = 0;
  std::string save_id;
  std::vector<DeltaItem> items;
  std::vector<DeltaFile> files;
};

// The manifest's text (above).
std::string SerializeDeltaManifest(const DeltaManifest& manifest);

// Parses and checks a manifest: its CRC, every field, and that each item has
// exactly the files its kind needs (kDataLoss otherwise; kFailedPrecondition
// for a newer format version).
Status ParseDeltaManifest(std::string_view text, DeltaManifest* out);

// A dense item's shape as the manifest writes it ("scalar", or "16x1").
std::string DeltaShapeString(const std::vector<int64_t>& shape);

// "delta-<serial>-<sequence>.dynemb-delta".
std::string DeltaManifestName(uint64_t base_serial, uint64_t sequence);
// Whether `name` is a committed manifest's name; sets its serial and sequence.
bool ParseDeltaManifestName(std::string_view name, uint64_t* base_serial, uint64_t* sequence);
// The stem of a data file (without ".<save id>.dynemb").
std::string DeltaFileStem(uint64_t base_serial, uint64_t sequence, int32_t item, DeltaRole role,
                          int32_t shard);
// Whether `name` is a file a delta write makes (a data file, a manifest or
// a manifest being written); sets the serial and sequence it belongs to.
bool ParseDeltaFileName(std::string_view name, uint64_t* base_serial, uint64_t* sequence);

}  // namespace dynemb

#endif  // DYNEMB_CORE_DELTA_H_
