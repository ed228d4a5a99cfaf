// memory_block.h: one buffer that comes from an Arena when the owner was given one, else is its own HostBuffer.
//
// The classes that hold a training step's memory (Gpt, PipelineModel, DistributedOptimizer) take an optional
// Arena*: the trainer passes its per-rank arena, so every byte of a step is a named, categorised arena allocation;
// unit tests pass nullptr and get plain HostBuffers. Either way the memory is zeroed (a HostBuffer is fresh
// mmap'd memory; an arena block is cleared by Arena::zero, since the arena may have handed the bytes out before).
// RAII: the destructor frees the arena block, so an Arena must outlive the blocks carved from it.
#pragma once

#include <cstddef>
#include <string>

#include "memory/arena.h"
#include "memory/host_buffer.h"

namespace ms {

class MemoryBlock {
  public:
    MemoryBlock() = default;
    // bytes == 0 holds nothing (data() is nullptr) and allocates nowhere.
    MemoryBlock(size_t bytes, Arena* arena, MemCategory category, std::string name);
    ~MemoryBlock();
    MemoryBlock(const MemoryBlock&) = delete;
    MemoryBlock& operator=(const MemoryBlock&) = delete;
    MemoryBlock(MemoryBlock&& o) noexcept;
    MemoryBlock& operator=(MemoryBlock&& o) noexcept;

    void* data() const { return data_; }
    size_t size() const { return size_; }
    template <typename T>
    T* as() const {
        return static_cast<T*>(data_);
    }

  private:
    void release();

    HostBuffer host_;         // without an arena
    Arena* arena_ = nullptr;  // with one: data_ is its allocation
    void* data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace ms
