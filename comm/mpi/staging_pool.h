// staging_pool.h: grow-only host buffers for collectives that must repack their input before MPI sees it.
//
// A chunked reduce-scatter has to lay each chunk's per-rank blocks out contiguously (MPI reductions take only
// basic datatypes, so no strided view will do). Every chunk is posted at call time -- posting a chunk later
// could interleave it with another op's calls differently on different ranks -- so an operation holds one
// buffer for its whole life. Buffers are leased, returned when the operation completes, and reused; a buffer
// only ever grows, so steady-state training allocates nothing. The pool is shared with the leases, so a
// lease outliving its communicator is still safe.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

namespace ms {

class StagingPool : public std::enable_shared_from_this<StagingPool> {
public:
    struct Buffer {
        std::unique_ptr<std::byte[]> data;
        size_t bytes = 0;
    };

    // Holds one buffer until destroyed or released; then it goes back to the pool.
    class Lease {
    public:
        Lease() = default;
        Lease(Lease&& o) noexcept : pool_(std::move(o.pool_)), buf_(std::move(o.buf_)) {}
        Lease& operator=(Lease&& o) noexcept {
            if (this != &o) {
                release();
                pool_ = std::move(o.pool_);
                buf_ = std::move(o.buf_);
            }
            return *this;
        }
        ~Lease() { release(); }
        std::byte* data() const { return buf_.data.get(); }
        void release() {
            if (pool_) pool_->free_.push_back(std::move(buf_));
            pool_.reset();
            buf_ = {};
        }

    private:
        friend class StagingPool;
        std::shared_ptr<StagingPool> pool_;
        Buffer buf_;
    };

    // A buffer of at least `bytes`: the largest free one, grown (replaced) if it is too small.
    Lease acquire(size_t bytes) {
        Lease lease;
        lease.pool_ = shared_from_this();
        if (!free_.empty()) {
            size_t best = 0;
            for (size_t i = 1; i < free_.size(); ++i)
                if (free_[i].bytes > free_[best].bytes) best = i;
            lease.buf_ = std::move(free_[best]);
            free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
        }
        if (lease.buf_.bytes < bytes) {
            lease.buf_.data = std::make_unique_for_overwrite<std::byte[]>(bytes);
            lease.buf_.bytes = bytes;
            allocations_ += 1;
        }
        return lease;
    }
    size_t free_buffers() const { return free_.size(); }
    size_t allocations() const { return allocations_; }  // buffers ever allocated or grown (tests check reuse)

private:
    std::vector<Buffer> free_;
    size_t allocations_ = 0;
};

}  // namespace ms
