// mapped_file.h: a read-only memory map of a whole file (RAII), the one way data/ reads token files.
//
// Opening names the file in every error: a missing or unreadable file throws UserError with the path, the OS
// reason and the hint passed by the caller (e.g. which config key holds the path). An empty file maps to
// {nullptr, 0}: mmap(2) refuses zero-length maps, and callers report "empty" in their own words.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace ms::data {

class MappedFile {
  public:
    MappedFile() = default;
    // `what` describes the file for messages ("Megatron index", "llm.c shard"); `hint` ends a missing-file error.
    MappedFile(const std::string& path, const std::string& what, const std::string& hint);
    ~MappedFile();
    MappedFile(MappedFile&& other) noexcept;
    MappedFile& operator=(MappedFile&& other) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }

    // Unaligned little-endian load of a T at byte `offset` (the caller has checked the bounds).
    template <typename T>
    T load(size_t offset) const {
        T v;
        std::memcpy(&v, data_ + offset, sizeof(T));
        return v;
    }

  private:
    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

// true when `path` names an existing regular file
bool is_regular_file(const std::string& path);

}  // namespace ms::data
