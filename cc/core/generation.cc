#include "cc/core/generation.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>

#include "cc/core/crc32c.h"
#include "cc/core/table_io.h"

namespace dynemb {
namespace {

bool IsDigits(std::string_view s, size_t n) {
  if (s.size() != n) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.substr(0, prefix.size()) == prefix;
}

// `rest` is "NNNNN-of-NNNNN" followed by `tail`; sets the two numbers.
bool ParseShardPart(std::string_view rest, std::string_view* tail, int32_t* index,
                    int32_t* num_shards) {
  if (rest.size() < 14 || !IsDigits(rest.substr(0, 5), 5) || rest.substr(5, 4) != "-of-" ||
      !IsDigits(rest.substr(9, 5), 5)) {
    return false;
  }
  *index = std::stoi(std::string(rest.substr(0, 5)));
  *num_shards = std::stoi(std::string(rest.substr(9, 5)));
  *tail = rest.substr(14);
  return true;
}

// `tail` is ".<id>.dynemb", ".<id>.dynemb.tmp-<id>" (a data file of any save).
bool IsDataTail(std::string_view tail) {
  if (!StartsWith(tail, ".")) return false;
  tail.remove_prefix(1);
  if (tail.size() < kSaveIdChars || !IsSaveId(tail.substr(0, kSaveIdChars))) return false;
  tail.remove_prefix(kSaveIdChars);
  if (!StartsWith(tail, ".dynemb")) return false;
  tail.remove_prefix(7);
  if (tail.empty()) return true;
  return StartsWith(tail, ".tmp-") && IsSaveId(tail.substr(5));
}

Status Damaged(const std::string& what) {
  return Status(StatusCode::kDataLoss, "the manifest is damaged: " + what);
}

}  // namespace

std::string NewSaveId() {
  // A random device alone may be a deterministic PRNG on some platforms: the
  // clock and a process-wide counter make ids of one process distinct anyway.
  static std::atomic<uint64_t> counter{0};
  std::random_device device;
  uint64_t bits = (static_cast<uint64_t>(device()) << 32) ^ device();
  bits ^= static_cast<uint64_t>(
      std::chrono::system_clock::now().time_since_epoch().count());
  bits ^= (counter.fetch_add(1) + 1) * 0x9e3779b97f4a7c15ULL;
  char buf[kSaveIdChars + 1];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(bits));
  return std::string(buf, kSaveIdChars);
}

bool IsSaveId(std::string_view id) {
  if (id.size() != kSaveIdChars) return false;
  for (char c : id) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string SerializeManifest(const Manifest& m) {
  std::ostringstream out;
  out << "tensorflow_dynemb manifest " << kManifestVersion << "\n"
      << "save_id " << m.save_id << "\n"
      << "key_type " << KeyTypeName(m.key_type) << "\n"
      << "value_type " << ValueTypeName(m.value_type) << "\n"
      << "dim " << m.dim << "\n"
      << "partitioner " << m.partitioner << "\n"
      << "num_shards " << m.num_shards << "\n";
  for (const ManifestFile& f : m.files) {
    char digest[9];
    std::snprintf(digest, sizeof(digest), "%08x", f.digest);
    out << "file " << f.shard_index << " " << f.name << " " << f.bytes << " " << f.rows << " "
        << digest << "\n";
  }
  return WithCrcLine(out.str());
}

std::string WithCrcLine(const std::string& text) {
  char crc[9];
  std::snprintf(crc, sizeof(crc), "%08x", Crc32c(text.data(), text.size()));
  return text + "crc " + crc + "\n";
}

std::string SplitCrcLine(std::string_view text, std::string_view* body) {
  // The last line holds the CRC of everything before it.
  if (text.empty() || text.back() != '\n') return "it does not end with a line break";
  const size_t last = text.rfind('\n', text.size() - 2);
  *body = last == std::string_view::npos ? "" : text.substr(0, last + 1);
  const std::string crc_line(text.substr(body->size(), text.size() - body->size() - 1));
  unsigned int crc = 0;
  char tail = 0;
  if (body->empty() || std::sscanf(crc_line.c_str(), "crc %8x%c", &crc, &tail) != 1) {
    return "no checksum line";
  }
  if (crc != Crc32c(body->data(), body->size())) return "checksum mismatch";
  return "";
}

Status ParseManifest(std::string_view text, Manifest* out) {
  std::string_view body;
  const std::string wrong = SplitCrcLine(text, &body);
  if (!wrong.empty()) return Damaged(wrong);

  Manifest m;
  std::istringstream lines{std::string(body)};
  std::string line;
  int version = 0;
  bool have[6] = {false, false, false, false, false, false};
  if (!std::getline(lines, line) ||
      std::sscanf(line.c_str(), "tensorflow_dynemb manifest %d", &version) != 1) {
    return Damaged("no header line");
  }
  if (version > kManifestVersion) {
    return Status(StatusCode::kFailedPrecondition,
                  "manifest format version " + std::to_string(version) +
                      " is newer than this tensorflow_dynemb reads (" +
                      std::to_string(kManifestVersion) + "): upgrade tensorflow_dynemb");
  }
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string key;
    fields >> key;
    if (key == "save_id") {
      fields >> m.save_id;
      have[0] = IsSaveId(m.save_id);
    } else if (key == "key_type") {
      std::string name;
      fields >> name;
      have[1] = ParseKeyType(name, &m.key_type);
    } else if (key == "value_type") {
      std::string name;
      fields >> name;
      have[2] = ParseValueType(name, &m.value_type);
    } else if (key == "dim") {
      have[3] = static_cast<bool>(fields >> m.dim) && m.dim >= 1;
    } else if (key == "partitioner") {
      fields >> m.partitioner;
      have[4] = m.partitioner == "default" || m.partitioner == "custom";
    } else if (key == "num_shards") {
      have[5] = static_cast<bool>(fields >> m.num_shards) && m.num_shards >= 1;
    } else if (key == "file") {
      ManifestFile f;
      std::string digest;
      unsigned int value = 0;
      if (!(fields >> f.shard_index >> f.name >> f.bytes >> f.rows >> digest) ||
          digest.size() != 8 || std::sscanf(digest.c_str(), "%8x", &value) != 1) {
        return Damaged("a malformed file line '" + line + "'");
      }
      f.digest = value;
      m.files.push_back(std::move(f));
    } else {
      return Damaged("an unknown line '" + line + "'");
    }
  }
  const char* names[6] = {"save_id", "key_type", "value_type", "dim", "partitioner", "num_shards"};
  for (int i = 0; i < 6; ++i) {
    if (!have[i]) return Damaged(std::string("no valid ") + names[i] + " line");
  }
  if (static_cast<int64_t>(m.files.size()) != m.num_shards) {
    return Damaged("it names " + std::to_string(m.files.size()) + " files for " +
                   std::to_string(m.num_shards) + " shards");
  }
  for (int32_t i = 0; i < m.num_shards; ++i) {
    const std::string& name = m.files[i].name;
    if (m.files[i].shard_index != i || name.empty() || name.find('/') != std::string::npos ||
        name == "." || name == "..") {
      return Damaged("file line " + std::to_string(i) + " names shard " +
                     std::to_string(m.files[i].shard_index) + ", file '" + name + "'");
    }
  }
  *out = std::move(m);
  return Status::Ok();
}

std::string ShardFileName(const std::string& prefix, int32_t index, int32_t num_shards,
                          const std::string& save_id) {
  char part[32];
  std::snprintf(part, sizeof(part), "-%05d-of-%05d.", index, num_shards);
  return prefix + part + save_id + ".dynemb";
}

std::string StemFileName(const std::string& stem, const std::string& save_id) {
  return stem + "." + save_id + ".dynemb";
}

bool NamesOwnedBy(std::string_view name, const std::string& prefix,
                  const std::vector<std::string>& stems) {
  for (const std::string& stem : stems) {
    if (StartsWith(name, stem) && IsDataTail(name.substr(stem.size()))) return true;
  }
  if (!StartsWith(name, prefix)) return false;
  std::string_view rest = name.substr(prefix.size());
  const std::string manifest_tmp = std::string(kManifestSuffix) + ".tmp-";
  if (StartsWith(rest, manifest_tmp)) return IsSaveId(rest.substr(manifest_tmp.size()));
  if (!StartsWith(rest, "-")) return false;
  std::string_view tail;
  int32_t index, num_shards;
  if (!ParseShardPart(rest.substr(1), &tail, &index, &num_shards)) return false;
  return IsDataTail(tail) || tail == ".dynemb" || tail == ".dynemb.tmp";
}

bool ParseV1ShardFileName(std::string_view name, const std::string& prefix, int32_t* index,
                          int32_t* num_shards) {
  if (!StartsWith(name, prefix) || !StartsWith(name.substr(prefix.size()), "-")) return false;
  std::string_view tail;
  return ParseShardPart(name.substr(prefix.size() + 1), &tail, index, num_shards) &&
         tail == ".dynemb";
}

}  // namespace dynemb
