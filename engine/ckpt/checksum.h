// checksum.h: XXH64 (Yann Collet's xxHash, 64-bit, seed 0), the per-file checksum in checkpoint manifests.
//
// Why XXH64 and not CRC32C or FNV-1a: it reads 32-byte stripes with four independent accumulators, so a plain
// C++ build hashes at several GB/s per core (CRC32C needs SSE4.2 intrinsics to be fast, FNV-1a is byte-serial),
// and 64 bits make an accidental match on a corrupted multi-GB file negligible. This is the reference
// algorithm (xxhash.h, XXH64) written out here, so that `xxhsum -H64 <file>` / Python `xxhash.xxh64` give the
// same value; the test pins the published vectors. It detects corruption, not tampering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ms {

// Streaming XXH64: update() any number of times with any split of the input; digest() does not consume.
class Xxh64 {
  public:
    explicit Xxh64(uint64_t seed = 0);
    void update(const void* data, size_t n);
    uint64_t digest() const;

  private:
    uint64_t seed_;
    uint64_t acc_[4];     // the four stripe accumulators
    uint64_t total_ = 0;  // bytes seen
    unsigned char buf_[32];
    size_t buf_len_ = 0;  // bytes of an incomplete stripe held in buf_
};

uint64_t xxh64(const void* data, size_t n, uint64_t seed = 0);

// XXH64 of a whole file, read in 1 MiB chunks. Throws ms::UserError (kExitCheckpoint) naming the path and the
// errno text if the file cannot be opened or read.
uint64_t file_xxh64(const std::string& path);

// The manifest spelling: 16 lower-case hex digits, as xxhsum prints it.
std::string xxh64_hex(uint64_t h);

}  // namespace ms
