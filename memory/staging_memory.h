// staging_memory.h: room for a whole flat fp32 parameter buffer at the few moments a run needs one, held outside the
// arena and given back after use.
//
// With sharded master weights and 16-bit gradients no buffer of a training step can hold every parameter in fp32,
// yet model initialisation writes them all, a checkpoint load reads them all and a save gathers the shards into
// them (engine/train/pipeline.h, PipelineModel::params()). This is that place: mapped once at a fixed address (the
// optimizer and the checkpoint code keep the pointer), touched only by those moments, and release()d when a step
// starts. Host memory is an anonymous mapping not touched at creation, whose pages release() returns to the system
// (the address stays valid and reads zeros); a device backend's memory (Backend::make_arena_memory: CUDA managed
// memory) is kept, its pages where the last user left them.
#pragma once

#include <cstddef>
#include <memory>

#include "memory/arena_memory.h"

namespace ms {

class StagingMemory {
  public:
    StagingMemory() = default;
    // bytes of `device` memory (made for this by the caller), or of host memory when device is null
    StagingMemory(size_t bytes, std::unique_ptr<ArenaMemory> device);
    ~StagingMemory();
    StagingMemory(const StagingMemory&) = delete;
    StagingMemory& operator=(const StagingMemory&) = delete;
    StagingMemory(StagingMemory&& o) noexcept;
    StagingMemory& operator=(StagingMemory&& o) noexcept;

    void* data() const { return data_; }
    size_t size() const { return size_; }
    // Hands the host pages back (their contents are lost); a no-op for device memory.
    void release();

  private:
    void unmap();

    std::unique_ptr<ArenaMemory> device_;
    void* data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace ms
