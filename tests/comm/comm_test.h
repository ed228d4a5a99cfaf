// comm_test.h: shared pieces of the MPI test binary (test_comm), run under mpiexec -n {2, 4, 8}.
//
// Every rank runs every test in the same order; a test must reach the same collectives on every rank, so tests use
// EXPECT_* (not ASSERT_*) wherever a collective follows. Inputs are small integers so that every sum, max and
// power-of-two average is exact in fp32 and results are compared with == (nccl-tests "verifiable").
#pragma once

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include "comm/bootstrap.h"

namespace ms::test {

MpiRuntime& runtime();  // created by main() before any test
inline Communicator& world() { return runtime().world(); }

// What rank r contributes at element i: (r + 1) * (i % 7 + 1).
inline int32_t pattern(int r, size_t i) { return (r + 1) * static_cast<int32_t>(i % 7 + 1); }
// Sum over ranks 0..n-1 of pattern(r, i).
inline int32_t pattern_sum(int n, size_t i) { return n * (n + 1) / 2 * static_cast<int32_t>(i % 7 + 1); }

inline bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

// 0 .. world size - 1: the members of a group over the whole world, by world rank (the link model's decorators).
inline std::vector<int> everyone() {
    std::vector<int> v(static_cast<size_t>(world().size()));
    std::iota(v.begin(), v.end(), 0);
    return v;
}

}  // namespace ms::test
