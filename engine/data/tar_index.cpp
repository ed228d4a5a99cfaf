// tar_index.cpp: walk a tar archive's 512-byte headers (tar_index.h).
//
// Header layout (POSIX.1-1988 ustar): name[100] @0, size[12] @124, chksum[8] @148, typeflag @156, magic[6] @257,
// prefix[155] @345 (ustar only: GNU's "ustar  " magic uses those bytes for other fields). Numbers are octal text,
// or base-256 big-endian when the first byte has its top bit set (GNU, for sizes of 8 GiB and more). The checksum
// is the sum of the header's bytes with the checksum field read as spaces, unsigned or (old tars) signed. A
// member's data starts at the next 512-byte block and is padded to a multiple of 512. Extension headers ('x', 'L')
// apply to the header that follows them.
#include "engine/data/tar_index.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "engine/core/check.h"

namespace ms {
namespace {

constexpr int64_t kBlock = 512;
constexpr int64_t kMaxExtensionBytes = int64_t{1} << 20;  // a pax header or GNU long name larger than this is damage

std::string field_text(const uint8_t* p, size_t n) {
    const auto* end = static_cast<const uint8_t*>(std::memchr(p, 0, n));
    return std::string(reinterpret_cast<const char*>(p), end ? static_cast<size_t>(end - p) : n);
}

// An octal or base-256 number field; nullopt when it is neither.
std::optional<int64_t> field_number(const uint8_t* p, size_t n) {
    if (p[0] & 0x80) {
        if (p[0] == 0xFF) return std::nullopt;  // negative
        uint64_t v = p[0] & 0x7F;
        for (size_t k = 1; k < n; ++k) {
            if (v >> 55) return std::nullopt;
            v = (v << 8) | p[k];
        }
        return static_cast<int64_t>(v);
    }
    size_t k = 0;
    while (k < n && (p[k] == ' ' || p[k] == 0)) ++k;
    int64_t v = 0;
    bool digits = false;
    for (; k < n && p[k] >= '0' && p[k] <= '7'; ++k) {
        if (v >> 60) return std::nullopt;
        v = v * 8 + (p[k] - '0');
        digits = true;
    }
    for (; k < n; ++k) {
        if (p[k] != ' ' && p[k] != 0) return std::nullopt;
    }
    if (!digits) return int64_t{0};
    return v;
}

bool checksum_ok(const uint8_t* h) {
    const std::optional<int64_t> stored = field_number(h + 148, 8);
    if (!stored) return false;
    int64_t unsigned_sum = 0, signed_sum = 0;
    for (int64_t k = 0; k < kBlock; ++k) {
        const uint8_t b = (k >= 148 && k < 156) ? ' ' : h[k];
        unsigned_sum += b;
        signed_sum += static_cast<int8_t>(b);
    }
    return *stored == unsigned_sum || *stored == signed_sum;
}

// pax records "LEN key=value\n": the path and size this header sets for the next one (size -1: none)
void parse_pax(const std::string& data, std::optional<std::string>& path, int64_t& size) {
    size_t pos = 0;
    while (pos < data.size()) {
        const size_t space = data.find(' ', pos);
        if (space == std::string::npos) return;
        const int64_t len = std::atoll(data.substr(pos, space - pos).c_str());
        if (len <= 0 || pos + static_cast<size_t>(len) > data.size()) return;
        const std::string record = data.substr(space + 1, pos + static_cast<size_t>(len) - space - 2);
        const size_t eq = record.find('=');
        if (eq != std::string::npos) {
            const std::string key = record.substr(0, eq), value = record.substr(eq + 1);
            if (key == "path") path = value;
            if (key == "size") size = std::atoll(value.c_str());
        }
        pos += static_cast<size_t>(len);
    }
}

}  // namespace

ReadOnlyFile::ReadOnlyFile(const std::string& path, const std::string& what, const std::string& hint)
    : path_(path), what_(what) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
        const int err = errno;
        throw UserError(
            fmt::format("data error: cannot open {} '{}': {}; hint: {}", what, path, std::strerror(err), hint));
    }
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd_);
        throw UserError(fmt::format("data error: {} '{}' is not a regular file; hint: {}", what, path, hint));
    }
    size_ = st.st_size;
}

ReadOnlyFile::~ReadOnlyFile() { ::close(fd_); }

int64_t ReadOnlyFile::size() const { return size_; }

bool ReadOnlyFile::read_at(int64_t offset, void* out, int64_t n) const {
    auto* dst = static_cast<char*>(out);
    while (n > 0) {
        const ssize_t got = ::pread(fd_, dst, static_cast<size_t>(n), offset);
        if (got == 0) return false;
        if (got < 0) {
            if (errno == EINTR) continue;
            const int err = errno;
            throw UserError(fmt::format("data error: cannot read {} '{}' at byte {}: {}", what_, path_, offset,
                                        std::strerror(err)));
        }
        dst += got;
        offset += got;
        n -= got;
    }
    return true;
}

TarIndex read_tar_index(const std::string& path, const std::string& what, const std::string& hint) {
    const ReadOnlyFile file(path, what, hint);
    TarIndex index;
    index.file_size = file.size();
    std::optional<std::string> next_path;  // from a pax 'x' header or a GNU 'L' long name
    int64_t next_size = -1;                // from a pax 'x' header; -1: none
    uint8_t h[kBlock];
    for (int64_t pos = 0;;) {
        if (pos == index.file_size) break;  // no end-of-archive blocks: the members read are complete
        if (pos + kBlock > index.file_size || !file.read_at(pos, h, kBlock)) {
            index.damage = fmt::format(
                "truncated: the header at byte {} is cut short by the end of the file ({} "
                "bytes)",
                pos, index.file_size);
            break;
        }
        if (std::all_of(h, h + kBlock, [](uint8_t b) { return b == 0; })) break;  // end of archive
        const std::string header_name = field_text(h, 100);
        if (!checksum_ok(h)) {
            if (pos == 0) {
                throw UserError(
                    fmt::format("data error: {} '{}' is not a tar archive (its first 512 bytes are not a "
                                "tar header); hint: {}",
                                what, path, hint));
            }
            index.damage = fmt::format("damaged: the header at byte {} fails its checksum", pos);
            break;
        }
        const std::optional<int64_t> header_size = field_number(h + 124, 12);
        if (!header_size) {
            index.damage =
                fmt::format("damaged: the header of '{}' at byte {} has an unreadable size field", header_name, pos);
            index.damaged_name = header_name;
            break;
        }
        const char type = static_cast<char>(h[156]);
        const bool regular = type == '0' || type == '\0' || type == '7';
        const int64_t size = regular && next_size >= 0 ? next_size : *header_size;
        std::string name = header_name;
        if (regular && next_path) {
            name = *next_path;
        } else if (std::memcmp(h + 257, "ustar\0", 6) == 0 && h[345] != 0) {
            name = field_text(h + 345, 155) + "/" + header_name;
        }
        const int64_t data = pos + kBlock;
        if (size < 0 || data + size > index.file_size) {
            index.damage = fmt::format("truncated: member '{}' needs bytes [{}, {}) but the file has {} bytes", name,
                                       data, data + size, index.file_size);
            index.damaged_name = name;
            break;
        }
        if (type == 'x' || type == 'L') {
            if (size > kMaxExtensionBytes) {
                index.damage = fmt::format("damaged: the extension header at byte {} claims {} bytes", pos, size);
                break;
            }
            std::string text(static_cast<size_t>(size), '\0');
            file.read_at(data, text.data(), size);
            if (type == 'x') {
                parse_pax(text, next_path, next_size);
            } else {
                next_path = text.substr(0, text.find('\0'));
            }
        } else {
            if (regular) index.members.push_back({name, data, size});
            if (type != 'g') {  // a global header leaves the next header's extensions in place
                next_path.reset();
                next_size = -1;
            }
        }
        pos = data + (size + kBlock - 1) / kBlock * kBlock;
    }
    return index;
}

}  // namespace ms
