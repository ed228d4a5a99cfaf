#!/usr/bin/python3
"""hf_llama_reference.py: Llama in PyTorch from a Hugging Face Llama directory, the reference for
tests/e2e/test_hf_llama.cpp.

Usage: /usr/bin/python3 tests/e2e/hf_llama_reference.py HF_DIR WORK_DIR   (exits 77 if torch/numpy are missing)

Reads HF_DIR/config.json and HF_DIR/model.safetensors (or, as transformers does without it,
HF_DIR/model.safetensors.index.json and every shard its weight_map names) the way a Hugging Face consumer sees them --
the safetensors header is parsed here (neither `safetensors` nor `transformers` is needed), tensor names are
LlamaForCausalLM's, every weight is torch.nn.Linear's (out, in) -- and computes, written from transformers'
modeling_llama.py (LlamaForCausalLM, eager attention, no dropout): token embedding, per layer
x += o_proj(attn(RoPE(q_proj(rms(x))), RoPE(k_proj(rms(x))), v_proj(rms(x)))) with causal softmax scaled by
1/sqrt(head_dim) and key/value head h // (NH / NKV) serving query head h (repeat_kv), then
x += down_proj(silu(gate_proj(rms(x))) * up_proj(rms(x))); a final RMSNorm (x * rsqrt(mean(x^2) + eps) * weight);
logits = lm_head(x) (embed_tokens when tie_word_embeddings). RoPE as transformers computes it: inv_freq in float32
from rope_theta (rescaled as _compute_llama3_parameters does for rope_scaling "llama3"), cos/sin of
position * inv_freq duplicated over the two halves, q * cos + rotate_half(q) * sin with rotate_half(x) = [-x2, x1].

Input in WORK_DIR: shape.json {"B", "T", "micro_batches"}; tokens.bin, targets.bin: int32 (micro_batches, B, T).
Output in WORK_DIR: logits.bin float32 (B, T, V) of micro-batch 0; loss.txt: the mean over micro-batches of each
micro-batch's mean cross-entropy (float32 forward, float64 average), one line.
"""
import json
import math
import os
import sys

try:
    import torch
    import torch.nn.functional as F

    from hf_reference_io import read_weights, run_samples
except ImportError as e:
    print(f"hf_llama_reference.py: cannot import numpy and torch ({e})", file=sys.stderr)
    sys.exit(77)


def inv_freq(cfg, head_dim):
    """transformers' _compute_default_rope_parameters, then _compute_llama3_parameters when rope_scaling asks."""
    base = cfg["rope_theta"]
    f = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    scaling = cfg.get("rope_scaling")
    if scaling is None:
        return f
    assert scaling.get("rope_type", scaling.get("type")) == "llama3", scaling
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    wavelen = 2 * math.pi / f
    f_llama = torch.where(wavelen > low_freq_wavelen, f / factor, f)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * f_llama / factor + smooth * f_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, f_llama)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rms_norm(x, weight, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def forward(cfg, w, tokens):
    B, T = tokens.shape
    C, NH, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["rms_norm_eps"]
    NKV = cfg.get("num_key_value_heads") or NH
    HS = cfg.get("head_dim") or C // NH
    freqs = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq(cfg, HS)[None, :]  # (T, HS/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    x = w["model.embed_tokens.weight"][tokens]
    for l in range(cfg["num_hidden_layers"]):
        h = f"model.layers.{l}."
        a = rms_norm(x, w[h + "input_layernorm.weight"], eps)
        q = F.linear(a, w[h + "self_attn.q_proj.weight"]).view(B, T, NH, HS).transpose(1, 2)
        k = F.linear(a, w[h + "self_attn.k_proj.weight"]).view(B, T, NKV, HS).transpose(1, 2)
        v = F.linear(a, w[h + "self_attn.v_proj.weight"]).view(B, T, NKV, HS).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(NH // NKV, dim=1), v.repeat_interleave(NH // NKV, dim=1)  # repeat_kv
        s = (q @ k.transpose(-1, -2)) / math.sqrt(HS)
        s = s.masked_fill(~causal, float("-inf"))
        y = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, NH * HS)
        x = x + F.linear(y, w[h + "self_attn.o_proj.weight"])
        m = rms_norm(x, w[h + "post_attention_layernorm.weight"], eps)
        m = F.silu(F.linear(m, w[h + "mlp.gate_proj.weight"])) * F.linear(m, w[h + "mlp.up_proj.weight"])
        x = x + F.linear(m, w[h + "mlp.down_proj.weight"])
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else w["lm_head.weight"]
    return F.linear(x, head)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    hf_dir, work = sys.argv[1], sys.argv[2]
    torch.set_num_threads(2)
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"], cfg
    assert cfg["hidden_act"] == "silu" and not cfg["attention_bias"] and not cfg["mlp_bias"], cfg
    meta, w = read_weights(hf_dir)
    assert meta == {"format": "pt"}, meta
    C, V, F_ = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    NH, NKV, HS = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    assert w["model.embed_tokens.weight"].shape == (V, C)
    assert ("lm_head.weight" not in w) if cfg["tie_word_embeddings"] else w["lm_head.weight"].shape == (V, C)
    assert w["model.layers.0.self_attn.q_proj.weight"].shape == (NH * HS, C)
    assert w["model.layers.0.self_attn.k_proj.weight"].shape == (NKV * HS, C)
    assert w["model.layers.0.mlp.gate_proj.weight"].shape == (F_, C)
    assert w["model.layers.0.mlp.down_proj.weight"].shape == (C, F_)
    run_samples(work, V, lambda tokens: forward(cfg, w, tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
