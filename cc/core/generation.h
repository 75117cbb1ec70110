// Generations: the files one save of a de.Variable (or of anything saved as
// a set of table files) writes, and the manifest that makes them one.
//
// A save picks a new save id and writes every data file of the generation
// under a name that carries it (`<prefix>-00001-of-00003.<save id>.dynemb`,
// table_io.h format version 2, the id in each file's header too). Only when
// every data file is complete and synced does it write the manifest, aside
// and renamed into place (`<prefix>.dynemb-manifest`): the manifest is the
// commit. It names each file with its shard, size, rows and digest, and the
// key and value types, dim, partitioner and shard count of the save. A crash
// at any moment leaves the old manifest (and the old generation's files,
// which the new save deletes only after its manifest is in place) or the new
// one; files no manifest names are a killed save's, and the next save of
// the prefix deletes them (NamesOwnedBy says which names a prefix owns).
//
// The manifest is text, one field per line, and ends with the CRC32C of the
// bytes before its last line, so a damaged manifest is detected like a
// damaged data file:
//   tensorflow_dynemb manifest 1
//   save_id 3f0c9a61d2b47e85
//   key_type int64
//   value_type float32
//   dim 8
//   partitioner default
//   num_shards 2
//   file 0 emb-00000-of-00002.3f0c9a61d2b47e85.dynemb 1234 500 a1b2c3d4
//   file 1 emb-00001-of-00002.3f0c9a61d2b47e85.dynemb 1217 493 0e9f8d7c
//   crc 5d41402a
// (file: shard, name relative to the manifest's directory, bytes, rows,
// digest). No TensorFlow dependency; the kernels do the file system work.

#ifndef DYNEMB_CORE_GENERATION_H_
#define DYNEMB_CORE_GENERATION_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/table.h"

namespace dynemb {

constexpr char kManifestSuffix[] = ".dynemb-manifest";
constexpr int kManifestVersion = 1;

struct ManifestFile {
  int32_t shard_index = 0;
  std::string name;  // relative to the manifest's directory
  uint64_t bytes = 0;
  uint64_t rows = 0;
  uint32_t digest = 0;
};

struct Manifest {
  std::string save_id;
  KeyType key_type = KeyType::kInt64;
  ValueType value_type = ValueType::kFloat32;
  int64_t dim = 1;
  // "default": keys routed by ShardOfKey (partition.h), checked on load;
  // "custom": by a partitioner the files cannot name.
  std::string partitioner = "default";
  int32_t num_shards = 1;
  std::vector<ManifestFile> files;  // one per shard, in shard order
};

// A new save id: kSaveIdChars (table_io.h) lowercase hex characters from
// the system's random source and the clock. Thread-safe.
std::string NewSaveId();

// Whether `id` looks like a save id (what file names may carry).
bool IsSaveId(std::string_view id);

// The manifest's text (above).
std::string SerializeManifest(const Manifest& manifest);

// How a manifest's text ends (this one's and the delta manifests',
// delta.h): `text` and then the line "crc <8 hex digits>", the CRC32C of `text`.
std::string WithCrcLine(const std::string& text);

// Checks the crc line WithCrcLine ends `text` with; sets *body to the text
// before it. Returns an empty string, or what is wrong ("checksum mismatch").
std::string SplitCrcLine(std::string_view text, std::string_view* body);

// Parses and checks a manifest's text: kDataLoss for a damaged one (its
// CRC, a missing or malformed field), kFailedPrecondition for a manifest
// of a newer format version.
Status ParseManifest(std::string_view text, Manifest* out);

// The data file of shard `index` of `num_shards` in the save `save_id`.
std::string ShardFileName(const std::string& prefix, int32_t index, int32_t num_shards,
                          const std::string& save_id);

// A data file named by the caller (`stem`) in the save `save_id`.
std::string StemFileName(const std::string& stem, const std::string& save_id);

// Whether `name` (a file name, no directory) is one that saves of `prefix`
// (with `stems`, the data file stems a save named explicitly) write and may
// delete once no manifest names it: data files of any save id
// (`<prefix>-NNNNN-of-NNNNN.<id>.dynemb`, `<stem>.<id>.dynemb`, each also
// with `.tmp-<id>`), manifests being written (`<prefix>.dynemb-manifest
// .tmp-<id>`), and the version 1 files this package wrote before
// generations (`<prefix>-NNNNN-of-NNNNN.dynemb`, `.tmp`).
bool NamesOwnedBy(std::string_view name, const std::string& prefix,
                  const std::vector<std::string>& stems);

// Whether `name` is a version 1 shard file of `prefix`; sets its index and
// shard count.
bool ParseV1ShardFileName(std::string_view name, const std::string& prefix, int32_t* index,
                          int32_t* num_shards);

}  // namespace dynemb

#endif  // DYNEMB_CORE_GENERATION_H_
