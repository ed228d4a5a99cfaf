// alloc_guard.cpp: the counting global operator new (alloc_guard.h).
//
// The replacement operators live in the same object file as arm()/disarm(): a static library member is linked
// only when one of its symbols is referenced, and the trainer references StepAllocGuard, which brings the
// operators with it; a definition in the executable then takes precedence over libstdc++'s.
#include "memory/alloc_guard.h"

#include <atomic>
#include <cstdlib>
#include <new>

#include "engine/core/check.h"
#include "engine/core/switches.h"

namespace ms::alloc_guard {
namespace {

std::atomic<bool> g_armed{false};
std::atomic<uint64_t> g_allocations{0};
std::atomic<uint64_t> g_bytes{0};

inline void note(size_t bytes) {
    if (!g_armed.load(std::memory_order_relaxed)) return;
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    g_bytes.fetch_add(bytes, std::memory_order_relaxed);
    allocation_in_step(bytes);
}

void* allocate(size_t bytes) {
    note(bytes);
    if (bytes == 0) bytes = 1;
    for (;;) {
        if (void* p = std::malloc(bytes)) return p;
        std::new_handler h = std::get_new_handler();
        if (!h) throw std::bad_alloc();
        h();
    }
}

void* allocate_aligned(size_t bytes, size_t align) {
    note(bytes);
    if (align < sizeof(void*)) align = sizeof(void*);
    const size_t rounded = (bytes + align - 1) / align * align;
    for (;;) {
        if (void* p = std::aligned_alloc(align, rounded == 0 ? align : rounded)) return p;
        std::new_handler h = std::get_new_handler();
        if (!h) throw std::bad_alloc();
        h();
    }
}

}  // namespace

bool enabled() { return switches().check_allocs; }  // MS_CHECK_ALLOCS=1

void arm() {
    g_allocations.store(0, std::memory_order_relaxed);
    g_bytes.store(0, std::memory_order_relaxed);
    g_armed.store(true, std::memory_order_seq_cst);
}

Counts disarm() {
    g_armed.store(false, std::memory_order_seq_cst);
    return {g_allocations.load(std::memory_order_relaxed), g_bytes.load(std::memory_order_relaxed)};
}

// noinline and with a side effect the optimizer keeps, so a breakpoint here stops at every allocation in a step.
[[gnu::noinline]] void allocation_in_step(size_t bytes) { asm volatile("" : : "r"(bytes) : "memory"); }

}  // namespace ms::alloc_guard

namespace ms {

StepAllocGuard::StepAllocGuard(int64_t iteration, bool arm) : iteration_(iteration) {
    if (arm && alloc_guard::enabled()) {
        alloc_guard::arm();
        armed_ = true;
    }
}

StepAllocGuard::~StepAllocGuard() {
    if (armed_) alloc_guard::disarm();
}

void StepAllocGuard::check() {
    if (!armed_) return;
    armed_ = false;
    const alloc_guard::Counts c = alloc_guard::disarm();
    MS_CHECK(c.allocations == 0,
             "memory: training step {} made {} heap allocation(s) ({} B) outside the arena; a step must allocate "
             "nothing (memory/alloc_guard.h). Break on ms::alloc_guard::allocation_in_step to find them.",
             iteration_, c.allocations, c.bytes);
}

}  // namespace ms

// ---- the replaced global allocation functions (every form that allocates; the deletes match malloc) ----

void* operator new(size_t n) { return ms::alloc_guard::allocate(n); }
void* operator new[](size_t n) { return ms::alloc_guard::allocate(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept {
    try {
        return ms::alloc_guard::allocate(n);
    } catch (...) {
        return nullptr;
    }
}
void* operator new[](size_t n, const std::nothrow_t&) noexcept {
    try {
        return ms::alloc_guard::allocate(n);
    } catch (...) {
        return nullptr;
    }
}
void* operator new(size_t n, std::align_val_t a) {
    return ms::alloc_guard::allocate_aligned(n, static_cast<size_t>(a));
}
void* operator new[](size_t n, std::align_val_t a) {
    return ms::alloc_guard::allocate_aligned(n, static_cast<size_t>(a));
}
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
    try {
        return ms::alloc_guard::allocate_aligned(n, static_cast<size_t>(a));
    } catch (...) {
        return nullptr;
    }
}
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
    try {
        return ms::alloc_guard::allocate_aligned(n, static_cast<size_t>(a));
    } catch (...) {
        return nullptr;
    }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
