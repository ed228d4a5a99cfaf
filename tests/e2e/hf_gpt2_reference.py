#!/usr/bin/python3
"""hf_gpt2_reference.py: GPT-2 in PyTorch from a Hugging Face GPT-2 directory, the reference for
tests/e2e/test_hf_interop.cpp.

Usage: /usr/bin/python3 tests/e2e/hf_gpt2_reference.py HF_DIR WORK_DIR   (exits 77 if torch/numpy are missing)

Reads HF_DIR/config.json and HF_DIR/model.safetensors (or, as transformers does without it,
HF_DIR/model.safetensors.index.json and every shard its weight_map names, each tensor from its shard) the way a
Hugging Face consumer sees them -- the safetensors header is parsed here (the `safetensors` package is not needed),
tensor names are GPT-2's hub names and the four Conv1D weights are (in, out), applied as x @ W + b as transformers'
Conv1D does -- and computes, written from the
GPT-2 definition (transformers' GPT2LMHeadModel with activation gelu_new, no dropout, tied head): pre-LayerNorm
blocks, causal attention scaled by 1/sqrt(head size), GELU-tanh MLP, final LayerNorm, logits = x @ wte^T over
the real vocabulary (V = config vocab_size; no padding exists in an HF export).

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
    print(f"hf_gpt2_reference.py: cannot import numpy and torch ({e})", file=sys.stderr)
    sys.exit(77)

def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def conv1d(x, w, b):  # transformers' Conv1D: weight (in, out)
    return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).reshape(*x.shape[:-1], w.shape[-1])


def forward(cfg, w, tokens):
    B, T = tokens.shape
    C, NH, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    HS = C // NH
    x = w["wte.weight"][tokens] + w["wpe.weight"][:T].unsqueeze(0)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(cfg["n_layer"]):
        h = f"h.{l}."
        a = F.layer_norm(x, (C,), w[h + "ln_1.weight"], w[h + "ln_1.bias"], eps)
        qkv = conv1d(a, w[h + "attn.c_attn.weight"], w[h + "attn.c_attn.bias"])
        q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in qkv.split(C, dim=2))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(HS)
        s = s.masked_fill(~causal, float("-inf"))
        y = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + conv1d(y, w[h + "attn.c_proj.weight"], w[h + "attn.c_proj.bias"])
        m = F.layer_norm(x, (C,), w[h + "ln_2.weight"], w[h + "ln_2.bias"], eps)
        m = gelu_new(conv1d(m, w[h + "mlp.c_fc.weight"], w[h + "mlp.c_fc.bias"]))
        x = x + conv1d(m, w[h + "mlp.c_proj.weight"], w[h + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), w["ln_f.weight"], w["ln_f.bias"], eps)
    return x @ w["wte.weight"].t()


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    hf_dir, work = sys.argv[1], sys.argv[2]
    torch.set_num_threads(2)
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"], cfg
    assert cfg["activation_function"] == "gelu_new" and cfg["tie_word_embeddings"] is True, cfg
    meta, w = read_weights(hf_dir)
    assert meta == {"format": "pt"}, meta
    assert "lm_head.weight" not in w and not any(k.startswith("transformer.") for k in w), sorted(w)
    C, V, T_max = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
    F_ = cfg["n_inner"] or 4 * C
    assert w["wte.weight"].shape == (V, C) and w["wpe.weight"].shape == (T_max, C)
    assert w["h.0.attn.c_attn.weight"].shape == (C, 3 * C) and w["h.0.mlp.c_fc.weight"].shape == (C, F_)
    assert w["h.0.mlp.c_proj.weight"].shape == (F_, C)
    run_samples(work, V, lambda tokens: forward(cfg, w, tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
