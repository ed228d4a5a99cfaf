// memory_block.cpp: an arena allocation or a HostBuffer behind one handle (see memory_block.h).
#include "memory/memory_block.h"

#include <utility>

namespace ms {

MemoryBlock::MemoryBlock(size_t bytes, Arena* arena, MemCategory category, std::string name) : size_(bytes) {
    if (bytes == 0) return;
    if (arena) {
        arena_ = arena;
        data_ = arena->allocate(bytes, category, std::move(name));
        arena->zero(data_, bytes);  // a memset for host memory; on the device for device memory
    } else {
        host_ = HostBuffer(bytes);
        data_ = host_.data();
    }
}

MemoryBlock::~MemoryBlock() { release(); }

void MemoryBlock::release() {
    if (arena_) arena_->free(data_);
    host_ = HostBuffer();
    arena_ = nullptr;
    data_ = nullptr;
    size_ = 0;
}

MemoryBlock::MemoryBlock(MemoryBlock&& o) noexcept
    : host_(std::move(o.host_)),
      arena_(std::exchange(o.arena_, nullptr)),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}

MemoryBlock& MemoryBlock::operator=(MemoryBlock&& o) noexcept {
    if (this != &o) {
        release();
        host_ = std::move(o.host_);
        arena_ = std::exchange(o.arena_, nullptr);
        data_ = std::exchange(o.data_, nullptr);
        size_ = std::exchange(o.size_, 0);
    }
    return *this;
}

}  // namespace ms
