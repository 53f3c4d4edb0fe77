// SHA-256 (FIPS 180-4), streamed: the hub names LFS files by the sha256 of their
// bytes, so a download is checked against its etag as the bytes arrive.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace transmuter::hub {

class Sha256 {
 public:
  Sha256() { reset(); }
  void reset();
  void update(const void* data, size_t size);
  /** Lowercase hex of the digest; the object must be reset() before reuse. */
  std::string hex_digest();

 private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> state_{};
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace transmuter::hub
