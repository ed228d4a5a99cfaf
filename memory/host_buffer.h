// host_buffer.h: one large, page-aligned host allocation, advised for huge pages and touched once at creation.
//
// The first touch of a fresh page costs far more than a later access to it (a page fault, and the kernel zeroing the
// page), so every buffer a training step uses is allocated once, touched once and reused: nothing large is freed and
// re-allocated per step. The arena (memory/arena_memory.h, HostArenaMemory) is one HostBuffer that tensors are
// carved out of.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ms {

class HostBuffer {
  public:
    HostBuffer() = default;
    explicit HostBuffer(size_t bytes);
    ~HostBuffer();
    HostBuffer(const HostBuffer&) = delete;
    HostBuffer& operator=(const HostBuffer&) = delete;
    HostBuffer(HostBuffer&& o) noexcept;
    HostBuffer& operator=(HostBuffer&& o) noexcept;

    void* data() const { return data_; }
    size_t size() const { return size_; }
    template <typename T>
    T* as() const {
        return static_cast<T*>(data_);
    }

  private:
    void* data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace ms
