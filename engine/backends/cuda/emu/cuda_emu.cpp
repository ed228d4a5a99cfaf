// cuda_emu.cpp: the block scheduler behind cuda_emu.h: fibers, barriers and the warp exchange.
//
// One Runner per OS thread holds the fiber stacks and the state of the block being run. A block runs in passes:
// each pass resumes every unfinished fiber in thread order, and each fiber runs until it waits at a barrier or
// returns. A barrier counts arrivals against the threads (or warp lanes) that have not returned; the last arrival
// bumps its generation, and the waiting fibers, which re-yield while the generation is unchanged, pass on the
// next pass. A pass in which no fiber arrived, released or returned can never end: that is a deadlock.
#include "engine/backends/cuda/emu/cuda_emu.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/core/check.h"

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace ms::cuda_emu {
namespace {

constexpr int kMaxThreads = 1024;
constexpr int kMaxWarps = kMaxThreads / 32;
constexpr size_t kStackBytes = 64 << 10;
constexpr size_t kSharedAlign = 128;
constexpr size_t kDefaultDynamicShared = 48 << 10;
constexpr int kMaxDynamicShared = 227 << 10;

struct Barrier {
    int arrived = 0;
    uint64_t generation = 0;
};

struct Warp {
    Barrier barrier;
    int live = 0;  // lanes that have not returned
    uint32_t live_mask = 0;
    uint64_t slots[32];  // the shuffle exchange, one value per lane
    float mma[2 * 256];  // wmma::mma_sync's exchange: the A and B operands, 16 x 16 each, row-major
};

// A cp.async of 16 bytes the thread issued and no wait_group has completed yet (emu/mma_emu.h).
struct AsyncCopy {
    unsigned char* dst;
    const unsigned char* src;  // null: zero-fill
};

struct Fiber {
    ucontext_t context;
    dim3 thread_idx;
    bool done;
    std::vector<AsyncCopy> copies;         // in issue order
    std::vector<size_t> group_ends;        // per committed group, oldest first: its end in copies
    std::vector<size_t> unfenced_chunks;   // 16-byte chunks of dynamic shared memory its cp.async landed since its
                                           // last fence.proxy.async (Runner::unfenced)
    std::vector<WgmmaOp> wgmma_ops;        // queued wgmma (emu/wgmma_emu.h), in issue order
    std::vector<size_t> wgmma_group_ends;  // per committed group, oldest first: its end in wgmma_ops
};

constexpr int kMaxWarpgroups = kMaxThreads / 128;

// A warpgroup's exchange for wgmma: its barrier and the A operand (64 x 16, row-major) of the wgmma being run.
struct Warpgroup {
    Barrier barrier;
    float a[64 * 16];
};

struct Runner {
    ucontext_t scheduler;
    char* stacks = nullptr;  // kMaxThreads stacks, each above a PROT_NONE guard page
    size_t stride = 0;
    std::vector<Fiber> fibers = std::vector<Fiber>(kMaxThreads);
    Warp warps[kMaxWarps];
    Warpgroup warpgroups[kMaxWarpgroups];
    Barrier block_barrier;
    int num_threads = 0;  // 0: no block is running
    int live = 0;         // threads of the block that have not returned
    int current = 0;      // linear id of the running fiber
    uint64_t progress = 0;
    std::vector<unsigned char> dynamic_storage;  // dynamic shared memory, from the first kSharedAlign boundary in it
    unsigned char* dynamic_shared = nullptr;
    size_t dynamic_bytes = 0;
    // per 16-byte chunk of dynamic shared memory: 1 + the thread whose cp.async landed there since that thread's last
    // fence.proxy.async, or 0; wgmma (the async proxy) must not read a chunk that is not 0
    std::vector<int> unfenced;
    void (*body)(const void*) = nullptr;
    const void* ctx = nullptr;

    Runner() {
        const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
        stride = kStackBytes + page;
        void* p = mmap(nullptr, stride * kMaxThreads, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        MS_CHECK(p != MAP_FAILED, "cuda_emu: cannot map {} bytes of fiber stacks", stride * kMaxThreads);
        stacks = static_cast<char*>(p);
        for (int t = 0; t < kMaxThreads; ++t) mprotect(stacks + t * stride, page, PROT_NONE);
    }
    ~Runner() { munmap(stacks, stride * kMaxThreads); }
    Runner(const Runner&) = delete;
    Runner& operator=(const Runner&) = delete;
};

Runner& runner() {
    thread_local std::unique_ptr<Runner> r = std::make_unique<Runner>();
    return *r;
}

void yield(Runner& r) { swapcontext(&r.fibers[r.current].context, &r.scheduler); }

void release(Runner& r, Barrier& b) {
    b.arrived = 0;
    ++b.generation;
    ++r.progress;
}

void wait(Runner& r, Barrier& b, int expected) {
    const uint64_t generation = b.generation;
    ++r.progress;
    if (++b.arrived == expected) {
        release(r, b);
        return;
    }
    while (b.generation == generation) yield(r);
}

Warp& current_warp(Runner& r, unsigned mask) {
    MS_CHECK(r.num_threads > 0, "cuda_emu: a barrier or warp collective outside a kernel");
    Warp& w = r.warps[r.current / 32];
    MS_CHECK((mask & w.live_mask) == w.live_mask,
             "cuda_emu: warp collective with mask {:#x} in warp {} whose live lanes are {:#x}: only full-warp "
             "collectives are emulated",
             mask, r.current / 32, w.live_mask);
    return w;
}

// Lands the copies of the running thread's oldest `groups` committed groups (marking those in dynamic shared memory
// as not yet visible to the async proxy).
void land_copies(Runner& r, size_t groups) {
    if (groups == 0) return;
    Fiber& f = r.fibers[r.current];
    const size_t end = f.group_ends[groups - 1];
    for (size_t i = 0; i < end; ++i) {
        if (f.copies[i].src != nullptr) {
            std::memcpy(f.copies[i].dst, f.copies[i].src, 16);
        } else {
            std::memset(f.copies[i].dst, 0, 16);
        }
        if (f.copies[i].dst >= r.dynamic_shared && f.copies[i].dst < r.dynamic_shared + r.dynamic_bytes) {
            const size_t chunk = static_cast<size_t>(f.copies[i].dst - r.dynamic_shared) / 16;
            r.unfenced[chunk] = r.current + 1;
            f.unfenced_chunks.push_back(chunk);
        }
    }
    f.copies.erase(f.copies.begin(), f.copies.begin() + static_cast<std::ptrdiff_t>(end));
    f.group_ends.erase(f.group_ends.begin(), f.group_ends.begin() + static_cast<std::ptrdiff_t>(groups));
    for (size_t& e : f.group_ends) e -= end;
}

// A returned thread no longer counts at barriers; it may be the one the others were waiting for.
void finish_thread(Runner& r) {
    Warp& w = r.warps[r.current / 32];
    r.fibers[r.current].done = true;
    --r.live;
    --w.live;
    w.live_mask &= ~(1u << (r.current % 32));
    ++r.progress;
    if (r.block_barrier.arrived > 0 && r.block_barrier.arrived == r.live) release(r, r.block_barrier);
    if (w.barrier.arrived > 0 && w.barrier.arrived == w.live) release(r, w.barrier);
}

void fiber_entry() {
    Runner& r = runner();
    r.body(r.ctx);
    finish_thread(r);
}  // returns to uc_link, the scheduler

void run_block(Runner& r) {
    const int n = r.num_threads;
    for (int t = 0; t < n; ++t) {
        Fiber& f = r.fibers[t];
        f.thread_idx = dim3(t % blockDim.x, t / blockDim.x % blockDim.y, t / (blockDim.x * blockDim.y));
        f.done = false;
        f.copies.clear();
        f.group_ends.clear();
        f.unfenced_chunks.clear();
        f.wgmma_ops.clear();
        f.wgmma_group_ends.clear();
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = r.stacks + t * r.stride + (r.stride - kStackBytes);
        f.context.uc_stack.ss_size = kStackBytes;
        f.context.uc_link = &r.scheduler;
        makecontext(&f.context, fiber_entry, 0);
    }
    for (int w = 0; w < (n + 31) / 32; ++w) {
        const int lanes = n - 32 * w < 32 ? n - 32 * w : 32;
        r.warps[w] = Warp{};
        r.warps[w].live = lanes;
        r.warps[w].live_mask = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
    }
    for (Warpgroup& wg : r.warpgroups) wg.barrier = Barrier{};
    r.block_barrier = Barrier{};
    // poisoned, so a kernel that reads dynamic shared memory before writing it fails its test (data() of an empty
    // vector may be null, which memset must not get even for 0 bytes)
    if (r.dynamic_bytes > 0) std::memset(r.dynamic_shared, 0xff, r.dynamic_bytes);
    r.unfenced.assign((r.dynamic_bytes + 15) / 16, 0);
    r.live = n;
    while (r.live > 0) {
        const uint64_t before = r.progress;
        for (int t = 0; t < n; ++t) {
            if (r.fibers[t].done) continue;
            r.current = t;
            threadIdx = r.fibers[t].thread_idx;
            swapcontext(&r.scheduler, &r.fibers[t].context);
        }
        MS_CHECK(r.progress != before,
                 "cuda_emu: deadlock in block ({}, {}, {}): {} of {} threads wait at barriers no thread can reach",
                 blockIdx.x, blockIdx.y, blockIdx.z, r.live, n);
    }
}

}  // namespace

void run_grid(dim3 grid, dim3 block, size_t shared_bytes, void (*body)(const void*), const void* ctx) {
    Runner& r = runner();
    MS_CHECK(r.num_threads == 0, "cuda_emu: a launch from inside a kernel");
    const uint64_t threads = uint64_t{block.x} * block.y * block.z;
    MS_CHECK(threads >= 1 && threads <= kMaxThreads, "cuda_emu: a block of {} x {} x {} threads (1 to {})", block.x,
             block.y, block.z, kMaxThreads);
    r.body = body;
    r.ctx = ctx;
    r.dynamic_storage.assign(shared_bytes + kSharedAlign, 0);
    const uintptr_t base = reinterpret_cast<uintptr_t>(r.dynamic_storage.data());
    r.dynamic_shared = r.dynamic_storage.data() + (kSharedAlign - base % kSharedAlign) % kSharedAlign;
    r.dynamic_bytes = shared_bytes;
    gridDim = grid;
    blockDim = block;
    r.num_threads = static_cast<int>(threads);
    for (unsigned z = 0; z < grid.z; ++z) {
        for (unsigned y = 0; y < grid.y; ++y) {
            for (unsigned x = 0; x < grid.x; ++x) {
                blockIdx = dim3(x, y, z);
                run_block(r);
            }
        }
    }
    r.num_threads = 0;
}

void* dynamic_shared() { return runner().dynamic_shared; }

namespace {
struct SharedOptIns {
    std::mutex mutex;
    std::map<const void*, int> bytes;  // kernel -> cudaFuncAttributeMaxDynamicSharedMemorySize
};
SharedOptIns& shared_opt_ins() {
    static SharedOptIns s;
    return s;
}
}  // namespace

void set_max_dynamic_shared(const void* kernel, int bytes) {
    MS_CHECK(bytes >= 0 && bytes <= kMaxDynamicShared,
             "cuda_emu: cudaFuncAttributeMaxDynamicSharedMemorySize {} is outside [0, {}] (a GPU refuses it)", bytes,
             kMaxDynamicShared);
    SharedOptIns& s = shared_opt_ins();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.bytes[kernel] = bytes;
}

void check_dynamic_shared(const void* kernel, size_t bytes) {
    if (bytes <= kDefaultDynamicShared) return;
    SharedOptIns& s = shared_opt_ins();
    std::lock_guard<std::mutex> lock(s.mutex);
    const auto it = s.bytes.find(kernel);
    const size_t allowed = it == s.bytes.end() ? kDefaultDynamicShared : static_cast<size_t>(it->second);
    MS_CHECK(bytes <= allowed,
             "cuda_emu: a launch with {} bytes of dynamic shared memory, over the kernel's limit of {} (more than 48 "
             "KiB needs cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) first)",
             bytes, allowed);
}

float* warp_mma_staging() {
    Runner& r = runner();
    MS_CHECK(r.num_threads > 0, "cuda_emu: a wmma operation outside a kernel");
    return r.warps[r.current / 32].mma;
}

void wmma_check_pointer(const void* p, unsigned ldm, size_t element_bytes, const char* op) {
    MS_CHECK(reinterpret_cast<uintptr_t>(p) % 32 == 0,
             "cuda_emu: wmma::{} on the pointer {}, which is not 256-bit aligned (mma.h requires it)", op, p);
    MS_CHECK(ldm * element_bytes % 16 == 0,
             "cuda_emu: wmma::{} with ldm {} of {}-byte elements: ldm must be a multiple of 16 bytes", op, ldm,
             element_bytes);
}

void ldmatrix_check_row(const void* p) {
    MS_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0,
             "cuda_emu: ldmatrix row address {}, which is not 16-byte aligned (the PTX ISA requires it)", p);
}

void cp_async_issue(void* dst, const void* src, bool valid) {
    Runner& r = runner();
    MS_CHECK(r.num_threads > 0, "cuda_emu: cp.async outside a kernel");
    MS_CHECK(reinterpret_cast<uintptr_t>(dst) % 16 == 0 && (!valid || reinterpret_cast<uintptr_t>(src) % 16 == 0),
             "cuda_emu: cp.async of 16 bytes from {} to {}: both must be 16-byte aligned", src, dst);
    r.fibers[r.current].copies.push_back(
        {static_cast<unsigned char*>(dst), valid ? static_cast<const unsigned char*>(src) : nullptr});
}

void cp_async_commit() {
    Runner& r = runner();
    MS_CHECK(r.num_threads > 0, "cuda_emu: cp.async.commit_group outside a kernel");
    Fiber& f = r.fibers[r.current];
    f.group_ends.push_back(f.copies.size());
}

void cp_async_wait(int pending) {
    Runner& r = runner();
    MS_CHECK(r.num_threads > 0, "cuda_emu: cp.async.wait_group outside a kernel");
    Fiber& f = r.fibers[r.current];
    const size_t groups = f.group_ends.size();
    land_copies(r, groups > static_cast<size_t>(pending) ? groups - static_cast<size_t>(pending) : 0);
}

void syncthreads() {
    Runner& r = runner();
    MS_CHECK(r.num_threads > 0, "cuda_emu: __syncthreads outside a kernel");
    wait(r, r.block_barrier, r.live);
}

void syncwarp(unsigned mask) {
    Runner& r = runner();
    Warp& w = current_warp(r, mask);
    wait(r, w.barrier, w.live);
}

uint64_t shuffle(unsigned mask, uint64_t bits, int src) {
    Runner& r = runner();
    Warp& w = current_warp(r, mask);
    w.slots[r.current % 32] = bits;
    wait(r, w.barrier, w.live);  // every live lane has written its slot
    const uint64_t result = src >= 0 && src < 32 && (w.live_mask >> src & 1u) ? w.slots[src] : bits;
    wait(r, w.barrier, w.live);  // every live lane has read before the next exchange overwrites the slots
    return result;
}

int lane_id() { return runner().current % 32; }

uint64_t wgmma_shared_address(const void* p) {
    Runner& r = runner();
    MS_CHECK(r.num_threads > 0, "cuda_emu: a wgmma descriptor outside a kernel");
    const auto* b = static_cast<const unsigned char*>(p);
    MS_CHECK(b >= r.dynamic_shared && b < r.dynamic_shared + r.dynamic_bytes && (b - r.dynamic_shared) % 16 == 0,
             "cuda_emu: a wgmma descriptor for {}, which is not a 16-byte aligned address in the block's dynamic "
             "shared memory",
             p);
    return static_cast<uint64_t>(b - r.dynamic_shared);
}

void fence_proxy_async() {
    Runner& r = runner();
    MS_CHECK(r.num_threads > 0, "cuda_emu: fence.proxy.async outside a kernel");
    Fiber& f = r.fibers[r.current];
    for (size_t chunk : f.unfenced_chunks) {
        if (r.unfenced[chunk] == r.current + 1) r.unfenced[chunk] = 0;
    }
    f.unfenced_chunks.clear();
}

void wgmma_issue(const WgmmaOp& op) {
    Runner& r = runner();
    MS_CHECK(r.num_threads > 0 && r.num_threads % 128 == 0,
             "cuda_emu: wgmma in a block of {} threads: it needs whole warpgroups (a multiple of 128)", r.num_threads);
    r.fibers[r.current].wgmma_ops.push_back(op);
}

void wgmma_commit() {
    Runner& r = runner();
    MS_CHECK(r.num_threads > 0, "cuda_emu: wgmma.commit_group outside a kernel");
    Fiber& f = r.fibers[r.current];
    f.wgmma_group_ends.push_back(f.wgmma_ops.size());
}

namespace {

// Element (mn, k) of the no-swizzle operand `desc` describes (wgmma.cuh's layouts), 16-bit, as a float.
float wgmma_element(const Runner& r, uint64_t desc, int mn, int k, bool mn_major, bool bf16_operands) {
    MS_CHECK((desc >> 49 & 0x7) == 0 && (desc >> 62) == 0,
             "cuda_emu: wgmma descriptor {:#x} asks for a swizzle or base offset; only the no-swizzle layout is "
             "emulated",
             desc);
    const uint64_t start = (desc & 0x3FFF) << 4, lbo = (desc >> 16 & 0x3FFF) << 4, sbo = (desc >> 32 & 0x3FFF) << 4;
    const uint64_t offset = mn_major ? start + (mn % 8) * 2 + (mn / 8) * sbo + (k % 8) * 16 + (k / 8) * lbo
                                     : start + (mn % 8) * 16 + (mn / 8) * sbo + (k % 8) * 2 + (k / 8) * lbo;
    MS_CHECK(offset + 2 <= r.dynamic_bytes,
             "cuda_emu: wgmma reads element ({}, {}) at byte {} of {} bytes of dynamic shared memory (descriptor "
             "{:#x})",
             mn, k, offset, r.dynamic_bytes, desc);
    const int writer = r.unfenced[offset / 16];
    MS_CHECK(writer == 0,
             "cuda_emu: wgmma reads byte {} of dynamic shared memory, which a cp.async of thread {} wrote with no "
             "fence.proxy.async by that thread since (wgmma reads through the async proxy: cuda/wgmma.cuh)",
             offset, writer - 1);
    uint16_t bits;
    std::memcpy(&bits, r.dynamic_shared + offset, 2);
    return bf16_operands ? to_float(bf16{bits}) : to_float(fp16{bits});
}

// Runs one queued wgmma for the calling thread (warpgroup-collective).
void run_wgmma(Runner& r, const WgmmaOp& op) {
    const int in_group = r.current % 128, warp = in_group / 32, lane = in_group % 32, g = lane >> 2, t = lane % 4;
    Warpgroup& wg = r.warpgroups[r.current / 128];
    if (op.a_in_registers) {
        for (int i = 0; i < 4; ++i) {
            const int row = 16 * warp + g + 8 * (i % 2), k = 2 * t + 8 * (i / 2);
            const uint16_t lo = static_cast<uint16_t>(op.a[i] & 0xffffu), hi = static_cast<uint16_t>(op.a[i] >> 16);
            wg.a[row * 16 + k] = op.bf16 ? to_float(bf16{lo}) : to_float(fp16{lo});
            wg.a[row * 16 + k + 1] = op.bf16 ? to_float(bf16{hi}) : to_float(fp16{hi});
        }
    }
    wait(r, wg.barrier, 128);  // every thread has published its A fragment (and the kernel's earlier writes are done)
    for (int j = 0; j < op.n / 8; ++j) {
        for (int i = 0; i < 4; ++i) {
            const int row = 16 * warp + g + 8 * (i / 2), col = 8 * j + 2 * t + i % 2;
            float acc = op.accumulate ? op.d[4 * j + i] : 0.0f;
            for (int k = 0; k < 16; ++k) {
                const float a =
                    op.a_in_registers ? wg.a[row * 16 + k] : wgmma_element(r, op.a_desc, row, k, false, op.bf16);
                acc += a * wgmma_element(r, op.b_desc, col, k, op.b_mn_major, op.bf16);
            }
            op.d[4 * j + i] = acc;
        }
    }
    wait(r, wg.barrier, 128);  // every thread has read the staging area before the next wgmma overwrites it
}

}  // namespace

void wgmma_wait(int pending) {
    Runner& r = runner();
    MS_CHECK(r.num_threads > 0, "cuda_emu: wgmma.wait_group outside a kernel");
    Fiber& f = r.fibers[r.current];
    const size_t groups = f.wgmma_group_ends.size();
    if (groups <= static_cast<size_t>(pending)) return;
    const size_t landing = groups - static_cast<size_t>(pending), end = f.wgmma_group_ends[landing - 1];
    for (size_t i = 0; i < end; ++i) run_wgmma(r, f.wgmma_ops[i]);
    f.wgmma_ops.erase(f.wgmma_ops.begin(), f.wgmma_ops.begin() + static_cast<std::ptrdiff_t>(end));
    f.wgmma_group_ends.erase(f.wgmma_group_ends.begin(),
                             f.wgmma_group_ends.begin() + static_cast<std::ptrdiff_t>(landing));
    for (size_t& e : f.wgmma_group_ends) e -= end;
}

void check_flag(const volatile int* flag, int expected) {
    const int value = *flag;
    MS_CHECK(value == expected,
             "cuda_emu: block ({}, {}, {}) waits for a flag to become {}, but it is {}: blocks run one at a time here, "
             "so no later block can set it (on a GPU this wait would depend on the order the hardware starts blocks "
             "in, or deadlock)",
             blockIdx.x, blockIdx.y, blockIdx.z, expected, value);
}

}  // namespace ms::cuda_emu
