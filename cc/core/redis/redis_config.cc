// RedisConfig: a small JSON reader for TFRA's config file (one object of
// scalars and arrays of scalars), and the checks of each field.

#include "cc/core/redis/redis_config.h"

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <utility>

namespace dynemb {
namespace redis {
namespace {

// A parsed JSON value (only what the config file holds).
struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  bool boolean = false;
  std::string text;  // kString: the string; kNumber: its literal
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> fields;
};

const char* KindName(Json::Kind kind) {
  switch (kind) {
    case Json::kNull: return "null";
    case Json::kBool: return "a boolean";
    case Json::kNumber: return "a number";
    case Json::kString: return "a string";
    case Json::kArray: return "an array";
    case Json::kObject: return "an object";
  }
  return "?";
}

class Reader {
 public:
  Reader(std::string_view s, const std::string& source) : s_(s), source_(source) {}

  Status Document(Json* out) {
    DYNEMB_RETURN_IF_ERROR(Value(out, 0));
    Space();
    if (pos_ != s_.size()) return Error("unexpected text after the JSON object");
    if (out->kind != Json::kObject) {
      return Error(std::string("the config must be a JSON object, got ") + KindName(out->kind));
    }
    return Status::Ok();
  }

 private:
  Status Error(const std::string& what) const {
    // Line and column of pos_, 1-based.
    int line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') ++line, col = 1; else ++col;
    }
    return InvalidArgument("malformed JSON in Redis config " + source_ + " at line " +
                           std::to_string(line) + ", column " + std::to_string(col) + ": " + what);
  }
  void Space() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' ||
                                s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Word(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }
  Status Value(Json* out, int depth) {
    if (depth > 8) return Error("nesting deeper than a config has");
    Space();
    if (pos_ >= s_.size()) return Error("unexpected end of the file");
    const char c = s_[pos_];
    if (c == '{') return Object(out, depth);
    if (c == '[') return Array(out, depth);
    if (c == '"') { out->kind = Json::kString; return String(&out->text); }
    // true/false (also Python's True/False, which TFRA's documentation shows).
    if (Word("true") || Word("True")) { out->kind = Json::kBool; out->boolean = true; return Status::Ok(); }
    if (Word("false") || Word("False")) { out->kind = Json::kBool; out->boolean = false; return Status::Ok(); }
    if (Word("null")) { out->kind = Json::kNull; return Status::Ok(); }
    if (c == '-' || (c >= '0' && c <= '9')) {
      const size_t begin = pos_;
      ++pos_;
      while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) ||
                                  s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E' ||
                                  s_[pos_] == '+' || s_[pos_] == '-')) {
        ++pos_;
      }
      out->kind = Json::kNumber;
      out->text = std::string(s_.substr(begin, pos_ - begin));
      return Status::Ok();
    }
    return Error(std::string("unexpected character '") + c + "'");
  }
  Status String(std::string* out) {
    ++pos_;  // the opening quote
    out->clear();
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return Status::Ok();
      if (c != '\\') { out->push_back(c); continue; }
      if (pos_ >= s_.size()) break;
      const char e = s_[pos_++];
      switch (e) {
        case '"': case '\\': case '/': out->push_back(e); break;
        case 'n': out->push_back('\n'); break;
        case 't': out->push_back('\t'); break;
        case 'r': out->push_back('\r'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'u': {
          if (pos_ + 4 > s_.size()) return Error("truncated \\u escape");
          const unsigned long cp = std::strtoul(std::string(s_.substr(pos_, 4)).c_str(), nullptr, 16);
          pos_ += 4;
          if (cp < 0x80) {
            out->push_back(static_cast<char>(cp));
          } else if (cp < 0x800) {
            out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
            out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
          } else {
            out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
            out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
            out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
          }
          break;
        }
        default: return Error(std::string("unknown escape \\") + e);
      }
    }
    return Error("unterminated string");
  }
  Status Array(Json* out, int depth) {
    ++pos_;
    out->kind = Json::kArray;
    Space();
    if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return Status::Ok(); }
    while (true) {
      out->items.emplace_back();
      DYNEMB_RETURN_IF_ERROR(Value(&out->items.back(), depth + 1));
      Space();
      if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
      if (pos_ < s_.size() && s_[pos_] == ']') { ++pos_; return Status::Ok(); }
      return Error("expected ',' or ']' in an array");
    }
  }
  Status Object(Json* out, int depth) {
    ++pos_;
    out->kind = Json::kObject;
    Space();
    if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return Status::Ok(); }
    while (true) {
      Space();
      if (pos_ >= s_.size() || s_[pos_] != '"') return Error("expected a quoted field name");
      std::string name;
      DYNEMB_RETURN_IF_ERROR(String(&name));
      Space();
      if (pos_ >= s_.size() || s_[pos_] != ':') return Error("expected ':' after \"" + name + "\"");
      ++pos_;
      out->fields.emplace_back(name, Json());
      DYNEMB_RETURN_IF_ERROR(Value(&out->fields.back().second, depth + 1));
      Space();
      if (pos_ < s_.size() && s_[pos_] == ',') { ++pos_; continue; }
      if (pos_ < s_.size() && s_[pos_] == '}') { ++pos_; return Status::Ok(); }
      return Error("expected ',' or '}' after field \"" + name + "\"");
    }
  }

  std::string_view s_;
  const std::string& source_;
  size_t pos_ = 0;
};

std::string Shown(const Json& v) {
  switch (v.kind) {
    case Json::kString: return "\"" + v.text + "\"";
    case Json::kNumber: return v.text;
    case Json::kBool: return v.boolean ? "true" : "false";
    default: return KindName(v.kind);
  }
}

Status FieldError(const std::string& source, const std::string& field, const Json& v,
                  const char* expected) {
  return InvalidArgument("Redis config " + source + ": field \"" + field + "\" must be " +
                         expected + ", got " + Shown(v));
}

Status ToInt64(const std::string& source, const std::string& field, const Json& v, int64_t* out) {
  if (v.kind != Json::kNumber) return FieldError(source, field, v, "an integer");
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.text.c_str(), &end, 10);
  if (errno != 0 || end == nullptr || *end != '\0') return FieldError(source, field, v, "an integer");
  *out = x;
  return Status::Ok();
}

Status ToInt(const std::string& source, const std::string& field, const Json& v, int* out) {
  int64_t x = 0;
  DYNEMB_RETURN_IF_ERROR(ToInt64(source, field, v, &x));
  if (x < INT32_MIN || x > INT32_MAX) return FieldError(source, field, v, "a 32-bit integer");
  *out = static_cast<int>(x);
  return Status::Ok();
}

}  // namespace

Status ParseRedisConfig(std::string_view json, const std::string& source, RedisConfig* c) {
  Json doc;
  DYNEMB_RETURN_IF_ERROR(Reader(json, source).Document(&doc));
  for (const auto& [name, v] : doc.fields) {
    const auto as_int = [&](int* out) { return ToInt(source, name, v, out); };
    const auto as_bool = [&](bool* out) {
      if (v.kind != Json::kBool) return FieldError(source, name, v, "true or false");
      *out = v.boolean;
      return Status::Ok();
    };
    const auto as_string = [&](std::string* out) {
      if (v.kind != Json::kString) return FieldError(source, name, v, "a string");
      *out = v.text;
      return Status::Ok();
    };
    const auto as_strings = [&](std::vector<std::string>* out) {
      out->clear();
      if (v.kind != Json::kArray) return FieldError(source, name, v, "an array of strings");
      for (const Json& item : v.items) {
        if (item.kind != Json::kString) return FieldError(source, name, item, "an array of strings");
        out->push_back(item.text);
      }
      return Status::Ok();
    };
    Status s;
    if (name == "redis_connection_mode") s = as_int(&c->redis_connection_mode);
    else if (name == "redis_master_name") s = as_string(&c->redis_master_name);
    else if (name == "redis_host_ip") s = as_strings(&c->redis_host_ip);
    else if (name == "redis_host_port") {
      c->redis_host_port.clear();
      if (v.kind == Json::kNumber) {  // TFRA's documentation shows a bare port
        int port;
        s = as_int(&port);
        c->redis_host_port.push_back(port);
      } else if (v.kind != Json::kArray) {
        s = FieldError(source, name, v, "an array of integers");
      } else {
        for (const Json& item : v.items) {
          int port = 0;
          s = ToInt(source, name, item, &port);
          if (!s.ok()) break;
          c->redis_host_port.push_back(port);
        }
      }
    }
    else if (name == "redis_user") s = as_string(&c->redis_user);
    else if (name == "redis_password") s = as_string(&c->redis_password);
    else if (name == "redis_db") s = as_int(&c->redis_db);
    else if (name == "redis_read_access_slave") s = as_bool(&c->redis_read_access_slave);
    else if (name == "redis_connect_keep_alive") s = as_bool(&c->redis_connect_keep_alive);
    else if (name == "redis_connect_timeout") s = as_int(&c->redis_connect_timeout);
    else if (name == "redis_socket_timeout") s = as_int(&c->redis_socket_timeout);
    else if (name == "redis_conn_pool_size") s = as_int(&c->redis_conn_pool_size);
    else if (name == "redis_wait_timeout") s = as_int(&c->redis_wait_timeout);
    else if (name == "redis_connection_lifetime") s = as_int(&c->redis_connection_lifetime);
    else if (name == "redis_sentinel_user") s = as_string(&c->redis_sentinel_user);
    else if (name == "redis_sentinel_password") s = as_string(&c->redis_sentinel_password);
    else if (name == "redis_sentinel_connect_timeout") s = as_int(&c->redis_sentinel_connect_timeout);
    else if (name == "redis_sentinel_socket_timeout") s = as_int(&c->redis_sentinel_socket_timeout);
    else if (name == "storage_slice_import") s = as_int(&c->storage_slice_import);
    else if (name == "storage_slice") s = as_int(&c->storage_slice);
    else if (name == "using_hash_storage_slice") s = as_bool(&c->using_hash_storage_slice);
    else if (name == "keys_sending_size") s = ToInt64(source, name, v, &c->keys_sending_size);
    else if (name == "using_md5_prefix_name") s = as_bool(&c->using_md5_prefix_name);
    else if (name == "redis_hash_tags_hypodispersion") s = as_bool(&c->redis_hash_tags_hypodispersion);
    else if (name == "model_tag_import") s = as_string(&c->model_tag_import);
    else if (name == "redis_hash_tags_import") s = as_strings(&c->redis_hash_tags_import);
    else if (name == "model_tag_runtime") s = as_string(&c->model_tag_runtime);
    else if (name == "redis_hash_tags_runtime") s = as_strings(&c->redis_hash_tags_runtime);
    else if (name == "expire_model_tag_in_seconds") s = as_int(&c->expire_model_tag_in_seconds);
    else if (name == "table_store_mode") s = as_int(&c->table_store_mode);
    else if (name == "model_lib_abs_dir") s = as_string(&c->model_lib_abs_dir);
    // Other fields are ignored, as TFRA ignores them (its examples carry some).
    DYNEMB_RETURN_IF_ERROR(s);
  }
  if (c->storage_slice_import <= 0) c->storage_slice_import = c->storage_slice;
  const Status valid = c->Validate();
  if (!valid.ok()) return InvalidArgument("Redis config " + source + ": " + valid.message());
  return Status::Ok();
}

Status RedisConfig::Validate() const {
  const auto bad = [](const std::string& field, const std::string& value, const char* expected) {
    return InvalidArgument("field \"" + field + "\" must be " + expected + ", got " + value);
  };
  if (redis_connection_mode < 0 || redis_connection_mode > 2) {
    return bad("redis_connection_mode", std::to_string(redis_connection_mode),
               "0 (cluster), 1 (sentinel) or 2 (standalone)");
  }
  if (redis_host_ip.empty()) return bad("redis_host_ip", "[]", "a non-empty array of hosts");
  if (redis_host_port.empty()) return bad("redis_host_port", "[]", "a non-empty array of ports");
  if (redis_host_port.size() != 1 && redis_host_port.size() != redis_host_ip.size()) {
    return bad("redis_host_port", std::to_string(redis_host_port.size()) + " ports",
               "one port, or one per host in redis_host_ip");
  }
  for (int port : redis_host_port) {
    if (port < 1 || port > 65535) return bad("redis_host_port", std::to_string(port), "in [1, 65535]");
  }
  if (redis_db < 0) return bad("redis_db", std::to_string(redis_db), ">= 0");
  if (redis_connect_timeout < 1) {
    return bad("redis_connect_timeout", std::to_string(redis_connect_timeout), ">= 1 (ms)");
  }
  if (redis_socket_timeout < 1) {
    return bad("redis_socket_timeout", std::to_string(redis_socket_timeout), ">= 1 (ms)");
  }
  if (redis_conn_pool_size < 1) {
    return bad("redis_conn_pool_size", std::to_string(redis_conn_pool_size), ">= 1");
  }
  if (redis_wait_timeout < 1) return bad("redis_wait_timeout", std::to_string(redis_wait_timeout), ">= 1 (ms)");
  if (storage_slice < 1) return bad("storage_slice", std::to_string(storage_slice), ">= 1");
  if (storage_slice > 16384) return bad("storage_slice", std::to_string(storage_slice), "<= 16384");
  if (keys_sending_size < 1) {
    return bad("keys_sending_size", std::to_string(keys_sending_size), ">= 1");
  }
  if (table_store_mode < 0 || table_store_mode > 2) {
    return bad("table_store_mode", std::to_string(table_store_mode), "0, 1 or 2");
  }
  for (const auto* tags : {&redis_hash_tags_runtime, &redis_hash_tags_import}) {
    for (const std::string& tag : *tags) {
      if (tag.empty() || tag == "{}") {
        return bad(tags == &redis_hash_tags_runtime ? "redis_hash_tags_runtime"
                                                    : "redis_hash_tags_import",
                   "\"" + tag + "\"", "non-empty hash tags such as \"{6379}\"");
      }
    }
  }
  return Status::Ok();
}

Status LoadRedisConfigFile(const std::string& path, RedisConfig* config) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(StatusCode::kNotFound, "cannot read the Redis config file " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseRedisConfig(buffer.str(), path, config);
}

}  // namespace redis
}  // namespace dynemb
