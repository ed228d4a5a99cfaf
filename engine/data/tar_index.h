// tar_index.h: the regular-file members of a tar archive (name, data offset, size), read from its headers alone.
//
// Reads the formats Python's tarfile and GNU tar write: POSIX ustar (name split into prefix + name), pax extended
// headers ('x': the path and size records; 'g' global headers are skipped), GNU long names ('L'), base-256 sizes.
// Only regular files ('0', '\0', '7') are listed; directories, links and other entries are stepped over. Each header's
// checksum is verified. Reading stops at the end-of-archive zero block or at the end of the file on a header
// boundary; a header cut short, a checksum that does not match or member data that runs past the end of the file
// stops it with `damage` set, keeping the members listed before.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ms {

struct TarMember {
    std::string name;    // full path inside the archive, as stored ("dir/000123.jpg")
    int64_t offset = 0;  // byte offset of the data in the file
    int64_t size = 0;    // bytes of data
};

struct TarIndex {
    std::vector<TarMember> members;  // regular files, in archive order
    int64_t file_size = 0;
    // empty when the archive reads to its end; else what is wrong, as a sentence fragment ("truncated: member
    // '000007.jpg' needs bytes [5632, 9728) but the file has 7000 bytes"), with damaged_name the member it concerns
    // (empty when no header could be read)
    std::string damage;
    std::string damaged_name;
};

// Throws UserError naming the file when it cannot be opened or read, or when its first header is not a tar header.
// `what` describes the file for messages ("WebDataset shard"), `hint` ends a missing-file error.
TarIndex read_tar_index(const std::string& path, const std::string& what, const std::string& hint);

// A read-only file descriptor (RAII) read with pread, so one object serves concurrent readers. Opening throws
// UserError with the path, the OS reason and `hint`, as data::MappedFile does.
class ReadOnlyFile {
  public:
    ReadOnlyFile(const std::string& path, const std::string& what, const std::string& hint);
    ~ReadOnlyFile();
    ReadOnlyFile(const ReadOnlyFile&) = delete;
    ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
    int64_t size() const;
    // reads exactly n bytes at offset, or returns false when the file ends first; throws UserError on an I/O error
    bool read_at(int64_t offset, void* out, int64_t n) const;

  private:
    std::string path_, what_;
    int fd_ = -1;
    int64_t size_ = 0;
};

}  // namespace ms
