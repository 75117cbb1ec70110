// MD5 as RFC 1321 specifies it: 64-byte blocks, four rounds of 16 steps.

#include "cc/core/redis/md5.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace dynemb {
namespace redis {
namespace {

inline uint32_t Rotl(uint32_t x, int c) { return (x << c) | (x >> (32 - c)); }

}  // namespace

std::array<uint8_t, 16> Md5(std::string_view data) {
  // Per-step shift amounts and the sine-derived constants of the RFC.
  static const int kShift[4][4] = {{7, 12, 17, 22}, {5, 9, 14, 20}, {4, 11, 16, 23}, {6, 10, 15, 21}};
  static const auto* kK = [] {
    auto* k = new uint32_t[64];
    for (int i = 0; i < 64; ++i) {
      k[i] = static_cast<uint32_t>(std::floor(std::fabs(std::sin(i + 1.0)) * 4294967296.0));
    }
    return k;
  }();
  uint32_t h[4] = {0x67452301u, 0xefcdab89u, 0x98badcfeu, 0x10325476u};
  std::vector<uint8_t> msg(data.begin(), data.end());
  const uint64_t bits = static_cast<uint64_t>(data.size()) * 8;
  msg.push_back(0x80);
  while (msg.size() % 64 != 56) msg.push_back(0);
  for (int i = 0; i < 8; ++i) msg.push_back(static_cast<uint8_t>(bits >> (8 * i)));
  for (size_t off = 0; off < msg.size(); off += 64) {
    uint32_t m[16];
    for (int i = 0; i < 16; ++i) {
      const uint8_t* p = &msg[off + 4 * i];
      m[i] = p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
    for (int i = 0; i < 64; ++i) {
      uint32_t f;
      int g;
      const int round = i / 16;
      if (round == 0) f = (b & c) | (~b & d), g = i;
      else if (round == 1) f = (d & b) | (~d & c), g = (5 * i + 1) % 16;
      else if (round == 2) f = b ^ c ^ d, g = (3 * i + 5) % 16;
      else f = c ^ (b | ~d), g = (7 * i) % 16;
      const uint32_t next = b + Rotl(a + f + kK[i] + m[g], kShift[round][i % 4]);
      a = d, d = c, c = b, b = next;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d;
  }
  std::array<uint8_t, 16> out;
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) out[4 * i + j] = static_cast<uint8_t>(h[i] >> (8 * j));
  }
  return out;
}

}  // namespace redis
}  // namespace dynemb
