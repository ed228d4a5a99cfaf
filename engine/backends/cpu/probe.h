// probe.h: a short sgemm probe that measures this CPU's attainable fp32 GEMM rate (the MFU denominator).
#pragma once

namespace ms::cpu {

// Best-of-`repeats` FLOP/s of a square-ish sgemm on the current OpenMP/OpenBLAS thread count (~0.2 s).
double sgemm_peak_flops(int repeats = 5);

}  // namespace ms::cpu
