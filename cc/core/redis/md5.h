// MD5 (RFC 1321), only for TFRA's using_md5_prefix_name bucket names
// (redis_table.h): not for anything that needs a secure hash.

#ifndef DYNEMB_CORE_REDIS_MD5_H_
#define DYNEMB_CORE_REDIS_MD5_H_

#include <array>
#include <cstdint>
#include <string_view>

namespace dynemb {
namespace redis {

// The 16-byte digest of `data`.
std::array<uint8_t, 16> Md5(std::string_view data);

}  // namespace redis
}  // namespace dynemb

#endif  // DYNEMB_CORE_REDIS_MD5_H_
