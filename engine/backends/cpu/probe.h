// probe.h: what the CPU backend can attain here: an sgemm probe (the MFU denominator) and the BLAS kernel in use.
#pragma once

#include <string>

namespace ms::cpu {

// Best FLOP/s of a 1024^3 sgemm on the current OpenMP thread count, the better of the two ways to thread it:
// OpenBLAS's own threads, and the backend's own split (single-threaded sgemm per OpenMP thread). ~0.2 s.
double sgemm_peak_flops(int repeats = 6);

// The OpenBLAS kernel chosen at load time (e.g. "SkylakeX", "Haswell", "Prescott").
std::string blas_kernel_name();

// Non-empty when OpenBLAS picked a kernel far below what this CPU supports (OpenBLAS 0.3.21 does not recognise
// some newer Xeons and falls back to its SSE3 "Prescott" kernel, ~5x slower): a sentence with the fix.
std::string blas_kernel_warning();

}  // namespace ms::cpu
