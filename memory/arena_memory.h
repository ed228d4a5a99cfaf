// arena_memory.h: the one allocation an Arena carves up, behind a small interface so that memory/ never depends on
// a device library.
//
// The default is host memory (HostArenaMemory: one HostBuffer, mmap'd and touched once). A backend whose kernels
// cannot read plain host memory supplies its own (Backend::make_arena_memory: the CUDA backend returns managed
// memory, engine/backends/cuda/cuda_backend.cpp). Either way the host may read and write every byte -- model
// initialisation, the token copies, the loss and MPI collectives work on arena pointers -- and zero() clears a
// range without the host having to touch it (a device memset for device memory, so setup does not fault every
// activation page over to the host and back).
#pragma once

#include <cstddef>
#include <cstring>

#include "memory/host_buffer.h"

namespace ms {

class ArenaMemory {
  public:
    virtual ~ArenaMemory() = default;
    virtual void* data() const = 0;
    virtual size_t size() const = 0;
    // bytes [p, p + bytes) of this memory = 0, complete when it returns.
    virtual void zero(void* p, size_t bytes) = 0;
    // Moves the memory to where the kernels run, once the host has initialised it (asynchronous; a no-op for host
    // memory).
    virtual void prefetch_to_device() {}
    // "host", or e.g. "CUDA managed memory on device 0": for the start-up log.
    virtual const char* describe() const = 0;
};

class HostArenaMemory final : public ArenaMemory {
  public:
    explicit HostArenaMemory(size_t bytes) : buffer_(bytes) {}
    void* data() const override { return buffer_.data(); }
    size_t size() const override { return buffer_.size(); }
    void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
    const char* describe() const override { return "host memory"; }

  private:
    HostBuffer buffer_;
};

}  // namespace ms
