// alloc_guard.h: counts heap allocations made while a training step runs, so "every byte of a step comes from the
// arena" is checked, not assumed (issue #6).
//
// The arena (memory/arena.h) holds every tensor; the arena's frozen mode catches arena allocations inside a step.
// This catches the rest: alloc_guard.cpp replaces the global operator new (every form), so any C++ allocation --
// a std::vector growing, a std::string formatted, a unique_ptr made -- while a guard is armed is counted. malloc
// calls from C libraries (MPI's and OpenBLAS's internals) are not ours and are not counted.
//
// Cost when disarmed: one relaxed atomic load per operator new. Armed only when the environment asks for it
// (MS_CHECK_ALLOCS=1, read once): the e2e tests arm it for every layout they train; a user can arm it too.
//
//   StepAllocGuard guard(iteration, true);   // arms (if enabled)
//   ... one training step ...
//   guard.check();                     // fatal if anything was allocated, naming the count and the bytes
//
// To find an allocation, break on ms::alloc_guard::allocation_in_step (called for each one while armed).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ms::alloc_guard {

// True when MS_CHECK_ALLOCS=1 was set when the process first asked.
bool enabled();

struct Counts {
    uint64_t allocations = 0;
    uint64_t bytes = 0;
};

// Starts counting (counts are reset). Not nestable.
void arm();
// Stops counting and returns what was allocated since arm().
Counts disarm();

// Called for every allocation while armed; a breakpoint target. Not for calling.
void allocation_in_step(size_t bytes);

}  // namespace ms::alloc_guard

namespace ms {

// Arms the guard for one step when enabled() and `arm`; check() disarms it and fails (MS_CHECK, fatal: a bug in the
// engine, not the user's input) if the step allocated. The destructor disarms without checking (an exception
// unwinding).
class StepAllocGuard {
  public:
    StepAllocGuard(int64_t iteration, bool arm);
    ~StepAllocGuard();
    StepAllocGuard(const StepAllocGuard&) = delete;
    StepAllocGuard& operator=(const StepAllocGuard&) = delete;
    void check();

  private:
    int64_t iteration_;
    bool armed_ = false;
};

}  // namespace ms
