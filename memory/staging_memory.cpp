#include "memory/staging_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "engine/core/check.h"

namespace ms {

StagingMemory::StagingMemory(size_t bytes, std::unique_ptr<ArenaMemory> device) : device_(std::move(device)) {
    if (device_) {
        data_ = device_->data();
        size_ = device_->size();
        return;
    }
    size_ = bytes;
    if (bytes == 0) return;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    MS_CHECK(p != MAP_FAILED, "mmap of {} bytes of staging memory failed: {}", bytes, std::strerror(errno));
    data_ = p;
}

StagingMemory::~StagingMemory() { unmap(); }

StagingMemory::StagingMemory(StagingMemory&& o) noexcept
    : device_(std::move(o.device_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

StagingMemory& StagingMemory::operator=(StagingMemory&& o) noexcept {
    if (this != &o) {
        unmap();
        device_ = std::move(o.device_);
        data_ = std::exchange(o.data_, nullptr);
        size_ = std::exchange(o.size_, 0);
    }
    return *this;
}

void StagingMemory::release() {
    if (device_ || data_ == nullptr) return;
    MS_CHECK(madvise(data_, size_, MADV_DONTNEED) == 0, "releasing {} bytes of staging memory failed: {}", size_,
             std::strerror(errno));
}

void StagingMemory::unmap() {
    if (!device_ && data_ != nullptr) munmap(data_, size_);
    device_.reset();
    data_ = nullptr;
}

}  // namespace ms
