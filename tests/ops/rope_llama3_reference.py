# rope_llama3_reference.py: prints the Llama 3 rotary inverse frequencies that tests/ops/test_llama_ops.cpp hard-codes,
# computed as Hugging Face transformers' _compute_default_rope_parameters and _compute_llama3_parameters do, in
# float64 (transformers computes in float32; the engine's table is computed in double). Run with Debian's python3
# and python3-torch: /usr/bin/python3 tests/ops/rope_llama3_reference.py
import math

import torch


def llama3_inv_freq(dim, base, factor, low_freq_factor, high_freq_factor, old_context_len):
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float64) / dim))
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


# Llama 3.1 8B: head size 128, theta 500000, factor 8, low 1, high 4, original context 8192.
f = llama3_inv_freq(128, 500000.0, 8.0, 1.0, 4.0, 8192)
print("llama3.1:", [(i, repr(f[i].item())) for i in (0, 25, 29, 31, 34, 40, 63)])
# A small head: HS 16, theta 10000, factor 4, original context 64 (all three bands).
g = llama3_inv_freq(16, 10000.0, 4.0, 1.0, 4.0, 64)
print("small:", [repr(x) for x in g.tolist()])
