#include "cc/core/delta.h"

#include <cstdio>
#include <sstream>

#include "cc/core/generation.h"
#include "cc/core/table_io.h"

namespace dynemb {
namespace {

Status Damaged(const std::string& what) {
  return Status(StatusCode::kDataLoss, "the delta manifest is damaged: " + what);
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.substr(0, prefix.size()) == prefix;
}

// Reads `n` decimal digits at the start of *s into *value and consumes them.
bool TakeDigits(std::string_view* s, size_t n, uint64_t* value) {
  if (s->size() < n) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) {
    const char c = (*s)[i];
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *value = v;
  s->remove_prefix(n);
  return true;
}

// "delta-<6 digits>-<8 digits>" at the start of *s.
bool TakeSerialAndSequence(std::string_view* s, uint64_t* serial, uint64_t* sequence) {
  if (!StartsWith(*s, "delta-")) return false;
  s->remove_prefix(6);
  if (!TakeDigits(s, 6, serial) || !StartsWith(*s, "-")) return false;
  s->remove_prefix(1);
  return TakeDigits(s, 8, sequence);
}

bool ParseShape(const std::string& text, std::vector<int64_t>* shape) {
  shape->clear();
  if (text == "scalar") return true;
  std::istringstream parts(text);
  std::string part;
  while (std::getline(parts, part, 'x')) {
    if (part.empty() || part.size() > 18 || part.find_first_not_of("0123456789") != std::string::npos) {
      return false;
    }
    shape->push_back(std::stoll(part));
  }
  return !shape->empty();
}

std::string Hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

// Every item has exactly the files its kind needs, once each.
Status CheckFiles(const DeltaManifest& m) {
  for (const DeltaFile& f : m.files) {
    if (f.item < 0 || f.item >= static_cast<int32_t>(m.items.size())) {
      return Damaged("a file line names item " + std::to_string(f.item) + " of " +
                     std::to_string(m.items.size()));
    }
    if (f.name.empty() || f.name.find('/') != std::string::npos || f.name == "." ||
        f.name == "..") {
      return Damaged("a file line names the file '" + f.name + "'");
    }
  }
  for (size_t i = 0; i < m.items.size(); ++i) {
    const DeltaItem& item = m.items[i];
    std::vector<DeltaRole> roles;
    int32_t shards = 1;
    if (item.dense) {
      roles = {DeltaRole::kDense};
    } else if (item.replace) {
      roles = {DeltaRole::kFull};
      shards = item.num_shards;
    } else {
      roles = {DeltaRole::kRows, DeltaRole::kRemoved};
      shards = item.num_shards;
    }
    for (DeltaRole role : roles) {
      for (int32_t shard = 0; shard < shards; ++shard) {
        int found = 0;
        for (const DeltaFile& f : m.files) {
          found += f.item == static_cast<int32_t>(i) && f.role == role && f.shard == shard;
        }
        if (found != 1) {
          return Damaged("item " + std::to_string(i) + " (" + item.identity + ") has " +
                         std::to_string(found) + " " + DeltaRoleName(role) +
                         " files for shard " + std::to_string(shard) + ", not 1");
        }
      }
    }
    int32_t total = 0;
    for (const DeltaFile& f : m.files) total += f.item == static_cast<int32_t>(i);
    if (total != static_cast<int32_t>(roles.size()) * shards) {
      return Damaged("item " + std::to_string(i) + " (" + item.identity + ") has " +
                     std::to_string(total) + " files");
    }
  }
  return Status::Ok();
}

}  // namespace

const char* DeltaRoleName(DeltaRole role) {
  switch (role) {
    case DeltaRole::kFull: return "full";
    case DeltaRole::kRows: return "rows";
    case DeltaRole::kRemoved: return "removed";
    case DeltaRole::kDense: return "dense";
  }
  return "unknown";
}

bool ParseDeltaRole(std::string_view name, DeltaRole* role) {
  for (DeltaRole r : {DeltaRole::kFull, DeltaRole::kRows, DeltaRole::kRemoved, DeltaRole::kDense}) {
    if (name == DeltaRoleName(r)) {
      *role = r;
      return true;
    }
  }
  return false;
}

std::string DeltaShapeString(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "scalar";
  std::string out;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += "x";
    out += std::to_string(shape[i]);
  }
  return out;
}

std::string SerializeDeltaManifest(const DeltaManifest& m) {
  std::ostringstream out;
  out << "tensorflow_dynemb delta " << kDeltaManifestVersion << "\n"
      << "base_id " << m.base_id << "\n"
      << "base_serial " << m.base_serial << "\n"
      << "sequence " << m.sequence << "\n"
      << "save_id " << m.save_id << "\n";
  for (const DeltaItem& item : m.items) {
    const std::string alt = item.alt.empty() ? "-" : item.alt;
    if (item.dense) {
      out << "dense " << item.identity << " " << alt << " " << ValueTypeName(item.value_type) << " "
          << DeltaShapeString(item.shape) << "\n";
    } else {
      out << "table " << item.identity << " " << alt << " " << KeyTypeName(item.key_type) << " "
          << ValueTypeName(item.value_type) << " " << item.dim << " " << item.partitioner << " "
          << item.num_shards << " " << (item.replace ? "replace" : "delta") << "\n";
    }
  }
  for (const DeltaFile& f : m.files) {
    out << "file " << f.item << " " << DeltaRoleName(f.role) << " " << f.shard << " " << f.name
        << " " << f.bytes << " " << f.rows << " " << Hex32(f.digest) << "\n";
  }
  return WithCrcLine(out.str());
}

Status ParseDeltaManifest(std::string_view text, DeltaManifest* out) {
  std::string_view body;
  const std::string wrong = SplitCrcLine(text, &body);
  if (!wrong.empty()) return Damaged(wrong);

  DeltaManifest m;
  std::istringstream lines{std::string(body)};
  std::string line;
  int version = 0;
  if (!std::getline(lines, line) ||
      std::sscanf(line.c_str(), "tensorflow_dynemb delta %d", &version) != 1) {
    return Damaged("no header line");
  }
  if (version > kDeltaManifestVersion) {
    return Status(StatusCode::kFailedPrecondition,
                  "delta manifest format version " + std::to_string(version) +
                      " is newer than this tensorflow_dynemb reads (" +
                      std::to_string(kDeltaManifestVersion) + "): upgrade tensorflow_dynemb");
  }
  bool have[4] = {false, false, false, false};
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string key;
    fields >> key;
    const auto malformed = [&] { return Damaged("a malformed line '" + line + "'"); };
    if (key == "base_id") {
      fields >> m.base_id;
      have[0] = IsSaveId(m.base_id);
    } else if (key == "base_serial") {
      have[1] = static_cast<bool>(fields >> m.base_serial);
    } else if (key == "sequence") {
      have[2] = static_cast<bool>(fields >> m.sequence);
    } else if (key == "save_id") {
      fields >> m.save_id;
      have[3] = IsSaveId(m.save_id);
    } else if (key == "table" || key == "dense") {
      DeltaItem item;
      item.dense = key == "dense";
      std::string alt, value_type;
      if (!(fields >> item.identity >> alt)) return malformed();
      item.alt = alt == "-" ? "" : alt;
      if (item.dense) {
        std::string shape;
        if (!(fields >> value_type >> shape) || !ParseValueType(value_type, &item.value_type) ||
            !ParseShape(shape, &item.shape)) {
          return malformed();
        }
      } else {
        std::string key_type, mode;
        if (!(fields >> key_type >> value_type >> item.dim >> item.partitioner >>
              item.num_shards >> mode) ||
            !ParseKeyType(key_type, &item.key_type) ||
            !ParseValueType(value_type, &item.value_type) || !CheckDim(item.dim).ok() ||
            (item.partitioner != "default" && item.partitioner != "custom") ||
            item.num_shards < 1 || (mode != "replace" && mode != "delta")) {
          return malformed();
        }
        item.replace = mode == "replace";
      }
      m.items.push_back(std::move(item));
    } else if (key == "file") {
      DeltaFile f;
      std::string role, digest;
      unsigned int value = 0;
      if (!(fields >> f.item >> role >> f.shard >> f.name >> f.bytes >> f.rows >> digest) ||
          !ParseDeltaRole(role, &f.role) || digest.size() != 8 ||
          std::sscanf(digest.c_str(), "%8x", &value) != 1) {
        return malformed();
      }
      f.digest = value;
      m.files.push_back(std::move(f));
    } else {
      return Damaged("an unknown line '" + line + "'");
    }
  }
  const char* names[4] = {"base_id", "base_serial", "sequence", "save_id"};
  for (int i = 0; i < 4; ++i) {
    if (!have[i]) return Damaged(std::string("no valid ") + names[i] + " line");
  }
  DYNEMB_RETURN_IF_ERROR(CheckFiles(m));
  *out = std::move(m);
  return Status::Ok();
}

std::string DeltaManifestName(uint64_t base_serial, uint64_t sequence) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "delta-%06llu-%08llu", static_cast<unsigned long long>(base_serial),
                static_cast<unsigned long long>(sequence));
  return std::string(buf) + kDeltaManifestSuffix;
}

bool ParseDeltaManifestName(std::string_view name, uint64_t* base_serial, uint64_t* sequence) {
  return TakeSerialAndSequence(&name, base_serial, sequence) && name == kDeltaManifestSuffix;
}

std::string DeltaFileStem(uint64_t base_serial, uint64_t sequence, int32_t item, DeltaRole role,
                          int32_t shard) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "delta-%06llu-%08llu-%04d-%s-%05d",
                static_cast<unsigned long long>(base_serial),
                static_cast<unsigned long long>(sequence), static_cast<int>(item),
                DeltaRoleName(role), static_cast<int>(shard));
  return buf;
}

bool ParseDeltaFileName(std::string_view name, uint64_t* base_serial, uint64_t* sequence) {
  if (!TakeSerialAndSequence(&name, base_serial, sequence)) return false;
  if (name == kDeltaManifestSuffix) return true;
  const std::string tmp = std::string(kDeltaManifestSuffix) + ".tmp-";
  if (StartsWith(name, tmp)) return IsSaveId(name.substr(tmp.size()));
  // "-<item>-<role>-<shard>.<save id>.dynemb"
  uint64_t item = 0, shard = 0;
  if (!StartsWith(name, "-")) return false;
  name.remove_prefix(1);
  if (!TakeDigits(&name, 4, &item) || !StartsWith(name, "-")) return false;
  name.remove_prefix(1);
  const size_t dash = name.find('-');
  DeltaRole role;
  if (dash == std::string_view::npos || !ParseDeltaRole(name.substr(0, dash), &role)) return false;
  name.remove_prefix(dash + 1);
  if (!TakeDigits(&name, 5, &shard) || !StartsWith(name, ".")) return false;
  name.remove_prefix(1);
  return name.size() == kSaveIdChars + 7 && IsSaveId(name.substr(0, kSaveIdChars)) &&
         name.substr(kSaveIdChars) == ".dynemb";
}

}  // namespace dynemb
