// device_peak.h: dense peak FLOP/s of the GPUs we know, the MFU denominators on the CUDA backend (docs/design.md §8).
//
// From NVIDIA's datasheets, dense (the datasheets' tensor-core figures are with 2:4 sparsity: halved here). fp32 is
// the non-tensor (SIMT) rate, which is what fp32 kernels without tensor cores can reach; tf32 and bf16 are the
// tensor-core rates. bench/gpu/gpt2_bench.py keeps the same table for the PyTorch peer.
#pragma once

#include <string_view>

namespace ms {

struct DevicePeak {
    const char* device;  // matched as a substring of the CUDA device name
    double fp32;         // FLOP/s, non-tensor
    double tf32;         // FLOP/s, tensor cores, dense
    double bf16;         // FLOP/s, tensor cores, dense
};

// The first table entry whose name occurs in device_name (e.g. "NVIDIA H200 (device 0 of 1, ...)"), or nullptr.
const DevicePeak* find_device_peak(std::string_view device_name);

}  // namespace ms
