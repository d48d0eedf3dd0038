// Little-endian integers appended to a byte string, as the zip and pickle
// formats that torch.save writes store them.
#pragma once

#include <cstdint>
#include <string>

namespace shardline {

// Appends the low `bytes` bytes of v, least significant first.
inline void AppendLittleEndian(std::string* out, uint64_t v, int bytes) {
  for (int k = 0; k < bytes; ++k) out->push_back(static_cast<char>((v >> (8 * k)) & 0xff));
}

}  // namespace shardline
