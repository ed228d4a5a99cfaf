#include "memory/host_buffer.h"

#include <sys/mman.h>

#include <cstring>
#include <utility>

#include "engine/core/check.h"

namespace ms {

HostBuffer::HostBuffer(size_t bytes) : size_(bytes) {
    if (bytes == 0) return;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    MS_CHECK(p != MAP_FAILED, "mmap of {} bytes failed: {}", bytes, std::strerror(errno));
    madvise(p, bytes, MADV_HUGEPAGE);  // advisory: ignored where transparent huge pages are off
    std::memset(p, 0, bytes);          // the one first touch, here and not inside a step
    data_ = p;
}

HostBuffer::~HostBuffer() {
    if (data_) munmap(data_, size_);
}

HostBuffer::HostBuffer(HostBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
    if (this != &o) {
        if (data_) munmap(data_, size_);
        data_ = std::exchange(o.data_, nullptr);
        size_ = std::exchange(o.size_, 0);
    }
    return *this;
}

}  // namespace ms
