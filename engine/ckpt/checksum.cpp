// checksum.cpp: XXH64, transcribed from the reference specification (xxhash doc/xxhash_spec.md, "XXH64").
#include "engine/ckpt/checksum.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <vector>

#include "engine/core/check.h"

namespace ms {
namespace {

static_assert(std::endian::native == std::endian::little, "XXH64 reads lanes little-endian; add byte swaps");

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

uint64_t read64(const unsigned char* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}
uint32_t read32(const unsigned char* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
uint64_t xxh_round(uint64_t acc, uint64_t lane) {
    acc += lane * kP2;
    acc = std::rotl(acc, 31);
    return acc * kP1;
}
uint64_t merge_round(uint64_t h, uint64_t acc) {
    h ^= xxh_round(0, acc);
    return h * kP1 + kP4;
}

}  // namespace

Xxh64::Xxh64(uint64_t seed) : seed_(seed), acc_{seed + kP1 + kP2, seed + kP2, seed, seed - kP1}, buf_{} {}

void Xxh64::update(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    total_ += n;
    if (buf_len_ + n < 32) {
        if (n) std::memcpy(buf_ + buf_len_, p, n);
        buf_len_ += n;
        return;
    }
    if (buf_len_) {  // complete the held stripe
        const size_t fill = 32 - buf_len_;
        std::memcpy(buf_ + buf_len_, p, fill);
        for (int i = 0; i < 4; ++i) acc_[i] = xxh_round(acc_[i], read64(buf_ + 8 * i));
        p += fill;
        n -= fill;
        buf_len_ = 0;
    }
    for (; n >= 32; p += 32, n -= 32)
        for (int i = 0; i < 4; ++i) acc_[i] = xxh_round(acc_[i], read64(p + 8 * i));
    if (n) std::memcpy(buf_, p, n);
    buf_len_ = n;
}

uint64_t Xxh64::digest() const {
    uint64_t h;
    if (total_ >= 32) {
        h = std::rotl(acc_[0], 1) + std::rotl(acc_[1], 7) + std::rotl(acc_[2], 12) + std::rotl(acc_[3], 18);
        for (int i = 0; i < 4; ++i) h = merge_round(h, acc_[i]);
    } else {
        h = seed_ + kP5;
    }
    h += total_;
    const unsigned char* p = buf_;
    size_t n = buf_len_;
    for (; n >= 8; p += 8, n -= 8) {
        h ^= xxh_round(0, read64(p));
        h = std::rotl(h, 27) * kP1 + kP4;
    }
    if (n >= 4) {
        h ^= uint64_t{read32(p)} * kP1;
        h = std::rotl(h, 23) * kP2 + kP3;
        p += 4;
        n -= 4;
    }
    for (; n > 0; ++p, --n) {
        h ^= *p * kP5;
        h = std::rotl(h, 11) * kP1;
    }
    h ^= h >> 33;
    h *= kP2;
    h ^= h >> 29;
    h *= kP3;
    h ^= h >> 32;
    return h;
}

uint64_t xxh64(const void* data, size_t n, uint64_t seed) {
    Xxh64 x(seed);
    x.update(data, n);
    return x.digest();
}

uint64_t file_xxh64(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        const int e = errno;
        throw UserError(fmt::format("checkpoint error: cannot open '{}' to checksum it: {}", path,
                                    std::generic_category().message(e)),
                        kExitCheckpoint);
    }
    Xxh64 x;
    std::vector<unsigned char> buf(1 << 20);
    for (;;) {
        const ssize_t got = ::read(fd, buf.data(), buf.size());
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            const int e = errno;
            ::close(fd);
            throw UserError(fmt::format("checkpoint error: cannot read '{}' to checksum it: {}", path,
                                        std::generic_category().message(e)),
                            kExitCheckpoint);
        }
        if (got == 0) break;
        x.update(buf.data(), static_cast<size_t>(got));
    }
    ::close(fd);
    return x.digest();
}

std::string xxh64_hex(uint64_t h) { return fmt::format("{:016x}", h); }

}  // namespace ms
