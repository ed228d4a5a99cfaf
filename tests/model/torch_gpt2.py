#!/usr/bin/python3
"""torch_gpt2.py: an independent GPT-2 in PyTorch, the reference for tests/model/test_gpt_vs_torch.cpp.

Usage: /usr/bin/python3 tests/model/torch_gpt2.py DIR   (needs torch and numpy; exits 77 if they cannot be imported)

The model is written here from the GPT-2 definition, not from the C++ code: token + learned position embeddings,
pre-LayerNorm blocks, causal multi-head attention through an explicit (B, NH, T, T) masked softmax, GELU with
the tanh approximation, biases everywhere, a final LayerNorm, the output head tied to wte, the padded vocabulary
columns (>= V) sliced off before a mean cross-entropy. Weights are in Linear orientation (out, in); c_attn's
rows are [Q | K | V], each block head-major.

Input, written by the C++ test into DIR (all binaries little-endian, no header):
  shape.json     {"L", "C", "NH", "T", "V", "Vp", "F", "eps", "B",
                  "lr", "beta1", "beta2", "adam_eps", "weight_decay", "clip_grad", "steps", "flat_size"}
                 T is the sequence length of the batch and equals the number of position embeddings.
  params.json    [{"name", "shape", "offset", "numel", "weight_decay"}, ...] in gpt_param_table() order;
                 offset and numel are in elements of the flat buffer.
  params.bin     float32[flat_size]: the C++ flat parameter buffer, each tensor at its offset (gaps ignored).
  tokens.bin     int32[B*T] row-major (B, T)
  targets.bin    int32[B*T]

Output, written into DIR:
  logits.bin          float32[B*T*Vp]: raw logits (B, T, Vp) of the float32 forward, padded columns included
  loss.txt            the float32 mean loss, one line
  grads.bin           float32[flat_size]: d(mean loss)/d(params) in the flat layout, 0 in the alignment gaps
  losses_adamw.txt    `steps` lines: the loss before each of `steps` AdamW steps on the same batch (float32)
  norms_adamw.txt     `steps` lines: the global gradient norm at each of those steps
  logits_f64.bin, loss_f64.txt, grads_f64.bin, losses_adamw_f64.txt: the same in float64 (float64 binaries),
                      the near-exact answer against which the float32 errors of both sides can be measured.

AdamW is written out by hand to match engine/backends' AdamWArgs (Megatron's adam): global-norm clipping with
coefficient clip / (norm + 1e-6) when that is < 1, folded into the update as g *= scale; m = b1 m + (1-b1) g;
v = b2 v + (1-b2) g^2; p -= lr * ((m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p), decoupled weight decay
only on >= 2-D parameters.
"""
import json
import math
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the C++ test turns exit code 77 into GTEST_SKIP
    print(f"torch_gpt2.py: cannot import numpy and torch ({e})", file=sys.stderr)
    sys.exit(77)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def layer_norm(x, w, b, eps):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # biased, as nn.LayerNorm
    return (x - mean) / torch.sqrt(var + eps) * w + b


class Gpt2(torch.nn.Module):
    def __init__(self, shape, tensors):
        super().__init__()
        self.s = shape
        # ParameterDict keys may not contain '.', so parameters are kept under mangled names.
        self.p = torch.nn.ParameterDict({k.replace(".", "__"): torch.nn.Parameter(v) for k, v in tensors.items()})

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def attention(self, x, l):
        B, T, C = x.shape
        NH = self.s["NH"]
        HS = C // NH
        qkv = F.linear(x, self.w(f"h.{l}.attn.c_attn.weight"), self.w(f"h.{l}.attn.c_attn.bias"))
        q, k, v = qkv.split(C, dim=-1)
        q = q.view(B, T, NH, HS).transpose(1, 2)  # (B, NH, T, HS)
        k = k.view(B, T, NH, HS).transpose(1, 2)
        v = v.view(B, T, NH, HS).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(HS)  # (B, NH, T, T)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
        probs = probs / probs.sum(dim=-1, keepdim=True)
        y = (probs @ v).transpose(1, 2).reshape(B, T, C)
        return F.linear(y, self.w(f"h.{l}.attn.c_proj.weight"), self.w(f"h.{l}.attn.c_proj.bias"))

    def forward(self, tokens, targets):
        s = self.s
        B, T = tokens.shape
        x = self.w("wte.weight")[tokens] + self.w("wpe.weight")[:T].unsqueeze(0)
        for l in range(s["L"]):
            h = f"h.{l}."
            x = x + self.attention(layer_norm(x, self.w(h + "ln_1.weight"), self.w(h + "ln_1.bias"), s["eps"]), l)
            y = layer_norm(x, self.w(h + "ln_2.weight"), self.w(h + "ln_2.bias"), s["eps"])
            y = gelu_tanh(F.linear(y, self.w(h + "mlp.c_fc.weight"), self.w(h + "mlp.c_fc.bias")))
            x = x + F.linear(y, self.w(h + "mlp.c_proj.weight"), self.w(h + "mlp.c_proj.bias"))
        x = layer_norm(x, self.w("ln_f.weight"), self.w("ln_f.bias"), s["eps"])
        logits = x @ self.w("wte.weight").t()  # (B, T, Vp), tied head
        real = logits[..., : s["V"]]  # the padded columns take no part in the softmax
        loss = F.cross_entropy(real.reshape(B * T, s["V"]), targets.reshape(B * T).long())
        return logits, loss


def load(d):
    with open(os.path.join(d, "shape.json")) as f:
        shape = json.load(f)
    with open(os.path.join(d, "params.json")) as f:
        table = json.load(f)
    flat = np.fromfile(os.path.join(d, "params.bin"), dtype="<f4")
    assert flat.size == shape["flat_size"], f"params.bin has {flat.size} floats, shape.json says {shape['flat_size']}"
    end = 0
    for p in table:
        assert p["offset"] >= end and p["numel"] == int(np.prod(p["shape"])), f"bad layout at {p['name']}"
        end = p["offset"] + p["numel"]
    assert end <= flat.size
    n = shape["B"] * shape["T"]
    tokens = np.fromfile(os.path.join(d, "tokens.bin"), dtype="<i4")
    targets = np.fromfile(os.path.join(d, "targets.bin"), dtype="<i4")
    assert tokens.size == n and targets.size == n
    return shape, table, flat, tokens.reshape(shape["B"], shape["T"]), targets.reshape(shape["B"], shape["T"])


def build(shape, table, flat, dtype):
    tensors = {}
    for p in table:
        a = flat[p["offset"] : p["offset"] + p["numel"]].reshape(p["shape"])
        tensors[p["name"]] = torch.tensor(a, dtype=torch.float32).to(dtype)
    return Gpt2(shape, tensors)


def flat_grads(model, table, flat_size, np_dtype):
    out = np.zeros(flat_size, dtype=np_dtype)
    for p in table:
        g = model.w(p["name"]).grad
        out[p["offset"] : p["offset"] + p["numel"]] = g.detach().reshape(-1).numpy()
    return out


def adamw_losses(shape, table, flat, tokens, targets, dtype):
    """Loss before each of `steps` AdamW steps on the same batch; the update is written out in `dtype`."""
    model = build(shape, table, flat, dtype)
    fd = np.float32 if dtype == torch.float32 else np.float64
    b1, b2, eps = fd(shape["beta1"]), fd(shape["beta2"]), fd(shape["adam_eps"])
    lr, wd = fd(shape["lr"]), fd(shape["weight_decay"])
    state = {p["name"]: (torch.zeros(p["shape"], dtype=dtype), torch.zeros(p["shape"], dtype=dtype)) for p in table}
    losses, norms = [], []
    for t in range(1, shape["steps"] + 1):
        model.zero_grad(set_to_none=False)
        _, loss = model(tokens, targets)
        loss.backward()
        losses.append(loss.item())
        sumsq = sum(float((model.w(p["name"]).grad.double() ** 2).sum()) for p in table)
        norm = math.sqrt(sumsq)
        norms.append(norm)
        coeff = shape["clip_grad"] / (norm + 1e-6)
        scale = fd(coeff) if shape["clip_grad"] > 0 and coeff < 1.0 else fd(1.0)
        bc1 = fd(1.0) - fd(float(b1) ** t)
        bc2 = fd(1.0) - fd(float(b2) ** t)
        with torch.no_grad():
            for p in table:
                w = model.w(p["name"])
                m, v = state[p["name"]]
                g = w.grad * float(scale)
                m.mul_(float(b1)).add_(g * float(fd(1.0) - b1))
                v.mul_(float(b2)).add_(g * g * float(fd(1.0) - b2))
                update = (m / float(bc1)) / (torch.sqrt(v / float(bc2)) + float(eps))
                if p["weight_decay"]:
                    update = update + float(wd) * w
                w.sub_(float(lr) * update)
    return losses, norms


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    d = sys.argv[1]
    torch.set_num_threads(2)
    shape, table, flat, tokens, targets = load(d)
    tok = torch.from_numpy(tokens.astype(np.int64))
    tgt = torch.from_numpy(targets.astype(np.int64))
    for dtype, suffix, np_dtype in ((torch.float32, "", np.float32), (torch.float64, "_f64", np.float64)):
        model = build(shape, table, flat, dtype)
        logits, loss = model(tok, tgt)
        loss.backward()
        logits.detach().numpy().astype(np_dtype).tofile(os.path.join(d, f"logits{suffix}.bin"))
        flat_grads(model, table, shape["flat_size"], np_dtype).tofile(os.path.join(d, f"grads{suffix}.bin"))
        with open(os.path.join(d, f"loss{suffix}.txt"), "w") as f:
            f.write(f"{loss.item():.17g}\n")
        losses, norms = adamw_losses(shape, table, flat, tok, tgt, dtype)
        with open(os.path.join(d, f"losses_adamw{suffix}.txt"), "w") as f:
            f.write("".join(f"{x:.17g}\n" for x in losses))
        if dtype == torch.float32:
            with open(os.path.join(d, "norms_adamw.txt"), "w") as f:
                f.write("".join(f"{x:.17g}\n" for x in norms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
