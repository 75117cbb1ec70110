// In-memory table files for the C++ core tests: a ByteSink that keeps what is
// written, and a ByteSource that reads a string back (optionally named, as a
// file would be, so that errors get the name prefixed).

#ifndef DYNEMB_CC_CORE_TESTS_MEMORY_STREAMS_H_
#define DYNEMB_CC_CORE_TESTS_MEMORY_STREAMS_H_

#include <cstring>
#include <string>
#include <utility>

#include "cc/core/table.h"

namespace dynemb {

struct MemorySink : ByteSink {
  std::string data;
  bool closed = false;
  Status Append(const void* p, size_t n) override {
    data.append(static_cast<const char*>(p), n);
    return Status::Ok();
  }
  Status Close() override {
    closed = true;
    return Status::Ok();
  }
};

struct MemorySource : ByteSource {
  std::string data;
  std::string name;
  size_t pos = 0;
  explicit MemorySource(std::string d, std::string n = "") : data(std::move(d)), name(std::move(n)) {}
  Status Read(void* p, size_t n, bool* eof) override {
    *eof = false;
    if (n == 0) return Status::Ok();
    if (pos == data.size()) {
      *eof = true;
      return Status::Ok();
    }
    if (data.size() - pos < n) return Status(StatusCode::kDataLoss, "short read");
    std::memcpy(p, data.data() + pos, n);
    pos += n;
    return Status::Ok();
  }
  Status Rewind() override {
    pos = 0;
    return Status::Ok();
  }
  std::string Name() const override { return name; }
};

}  // namespace dynemb

#endif  // DYNEMB_CC_CORE_TESTS_MEMORY_STREAMS_H_
