#!/usr/bin/python3
"""hf_clip_reference.py: transformers' CLIPModel in plain PyTorch (float64) from a Hugging Face CLIP directory, the
reference for tests/model/test_clip_hf.cpp.

Usage: /usr/bin/python3 tests/e2e/hf_clip_reference.py HF_DIR WORK_DIR   (exits 77 if torch/numpy are missing)

Reads HF_DIR/config.json and HF_DIR/model.safetensors as a Hugging Face consumer sees them (hf_reference_io.py: the
header parsed here, every tensor under its CLIPModel name and shape, the patch embedding a Conv2d weight
(C, 3, p, p), logit_scale a 0-d scalar), widens them to float64 and computes, written from the definition of
transformers' CLIPModel (no dropout, no attention mask, activation from hidden_act):
  image: Conv2d(pixels, patch_embedding, stride p) flattened to (B, P, C) row-major over the patch grid, the class
         embedding prepended, + position_embedding; pre_layrnorm; the encoder layers with bidirectional attention;
         post_layernorm of the class row; visual_projection
  text:  token_embedding[ids] + position_embedding; the encoder layers with a causal mask; final_layer_norm; the row
         of each caption's first eos_token_id; text_projection
  encoder layer: x + out_proj(attention(q/k/v_proj(layer_norm1(x)))), scores scaled by head_dim^-1/2;
                 then x + fc2(act(fc1(layer_norm2(x))))
  loss:  both feature sets L2-normalised, logits_per_text = exp(logit_scale) * text @ image^T (transformers does not
         clamp the scale), the mean of the cross-entropies of logits_per_text and its transpose against the diagonal.
If transformers imports, the directory is also loaded with transformers.CLIPModel.from_pretrained (float64) and its
features and loss must agree with the above to 1e-10 (relative to the largest feature; absolute for the loss).

Input in WORK_DIR: pixels.bin float32 (B, 3, S, S); tokens.bin int32 (B, T), T = the config's
max_position_embeddings, S its vision image_size.
Output in WORK_DIR: image_features.bin, text_features.bin float64 (B, projection_dim), the unnormalised projections;
loss.txt: the loss, one line.
"""
import json
import math
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from hf_reference_io import read_weights
except ImportError as e:
    print(f"hf_clip_reference.py: cannot import numpy and torch ({e})", file=sys.stderr)
    sys.exit(77)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


# transformers' two names of the tanh-approximated GELU; any other hidden_act is not what the exporter writes
ACTIVATIONS = {"gelu_new": gelu_tanh, "gelu_pytorch_tanh": gelu_tanh}


def encoder(cfg, w, prefix, x, causal):
    B, T, C = x.shape
    NH, eps = cfg["num_attention_heads"], cfg["layer_norm_eps"]
    HS = C // NH
    act = ACTIVATIONS[cfg["hidden_act"]]
    mask = torch.ones(T, T, dtype=torch.bool).tril() if causal else torch.ones(T, T, dtype=torch.bool)

    def linear(x, name):
        return x @ w[name + ".weight"].t() + w[name + ".bias"]

    def heads(t):
        return t.view(B, T, NH, HS).transpose(1, 2)

    for l in range(cfg["num_hidden_layers"]):
        p = f"{prefix}encoder.layers.{l}."
        a = F.layer_norm(x, (C,), w[p + "layer_norm1.weight"], w[p + "layer_norm1.bias"], eps)
        q, k, v = (heads(linear(a, p + f"self_attn.{m}_proj")) for m in "qkv")
        s = (q * HS**-0.5) @ k.transpose(-1, -2)
        s = s.masked_fill(~mask, float("-inf"))
        y = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + linear(y, p + "self_attn.out_proj")
        m = F.layer_norm(x, (C,), w[p + "layer_norm2.weight"], w[p + "layer_norm2.bias"], eps)
        x = x + linear(act(linear(m, p + "mlp.fc1")), p + "mlp.fc2")
    return x


def image_features(cfg, w, pixels):
    B, C, p = pixels.shape[0], cfg["hidden_size"], cfg["patch_size"]
    e = "vision_model.embeddings."
    patches = F.conv2d(pixels, w[e + "patch_embedding.weight"], stride=p).flatten(2).transpose(1, 2)  # (B, P, C)
    x = torch.cat([w[e + "class_embedding"].expand(B, 1, C), patches], dim=1)
    x = x + w[e + "position_embedding.weight"][: x.shape[1]]
    eps = cfg["layer_norm_eps"]
    x = F.layer_norm(x, (C,), w["vision_model.pre_layrnorm.weight"], w["vision_model.pre_layrnorm.bias"], eps)
    x = encoder(cfg, w, "vision_model.", x, causal=False)
    pooled = F.layer_norm(
        x[:, 0], (C,), w["vision_model.post_layernorm.weight"], w["vision_model.post_layernorm.bias"], eps
    )
    return pooled @ w["visual_projection.weight"].t()


def text_features(cfg, w, ids):
    B, T = ids.shape
    C, eps = cfg["hidden_size"], cfg["layer_norm_eps"]
    e = "text_model.embeddings."
    x = w[e + "token_embedding.weight"][ids] + w[e + "position_embedding.weight"][:T]
    x = encoder(cfg, w, "text_model.", x, causal=True)
    x = F.layer_norm(x, (C,), w["text_model.final_layer_norm.weight"], w["text_model.final_layer_norm.bias"], eps)
    assert cfg["eos_token_id"] != 2, "eos_token_id 2 pools at the argmax of the ids, which this reference omits"
    eos = (ids == cfg["eos_token_id"]).int().argmax(dim=-1)
    assert bool((ids[torch.arange(B), eos] == cfg["eos_token_id"]).all()), "a caption without eos_token_id"
    return x[torch.arange(B), eos] @ w["text_projection.weight"].t()


def clip_loss(image, text, logit_scale):
    image = image / image.norm(dim=-1, keepdim=True)
    text = text / text.norm(dim=-1, keepdim=True)
    logits_per_text = logit_scale.exp() * text @ image.t()
    labels = torch.arange(image.shape[0])
    return (F.cross_entropy(logits_per_text, labels) + F.cross_entropy(logits_per_text.t(), labels)) / 2


def check_with_transformers(hf_dir, pixels, ids, image, text, loss):
    """transformers' own CLIPModel on the same inputs, where it is installed."""
    try:
        import transformers
    except ImportError:
        return
    model = transformers.CLIPModel.from_pretrained(hf_dir, torch_dtype=torch.float64).eval()
    with torch.no_grad():
        out = model(input_ids=ids, pixel_values=pixels, return_loss=True)
    # CLIPModel's image_embeds / text_embeds are normalised: compare directions, and the loss.
    for name, ours, theirs in (("image", image, out.image_embeds), ("text", text, out.text_embeds)):
        err = float((ours / ours.norm(dim=-1, keepdim=True) - theirs).abs().max())
        assert err < 1e-10, f"transformers {transformers.__version__}: {name} features differ by {err}"
    assert abs(float(out.loss) - loss) < 1e-10, f"transformers: loss {float(out.loss)}, reference {loss}"
    print(f"hf_clip_reference.py: transformers {transformers.__version__} agrees")


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    hf_dir, work = sys.argv[1], sys.argv[2]
    torch.set_num_threads(2)
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["model_type"] == "clip" and cfg["architectures"] == ["CLIPModel"], cfg
    vcfg, tcfg = cfg["vision_config"], cfg["text_config"]
    meta, w32 = read_weights(hf_dir)
    assert meta == {"format": "pt"}, meta
    w = {k: t.double() for k, t in w32.items()}
    Cv, Ct, D, p = vcfg["hidden_size"], tcfg["hidden_size"], cfg["projection_dim"], vcfg["patch_size"]
    S, T = vcfg["image_size"], tcfg["max_position_embeddings"]
    assert w["vision_model.embeddings.patch_embedding.weight"].shape == (Cv, 3, p, p)
    assert w["vision_model.embeddings.class_embedding"].shape == (Cv,)
    assert w["logit_scale"].shape == ()
    assert w["visual_projection.weight"].shape == (D, Cv) and w["text_projection.weight"].shape == (D, Ct)

    ids32 = np.fromfile(os.path.join(work, "tokens.bin"), dtype="<i4")
    B = ids32.size // T
    ids = torch.from_numpy(ids32.reshape(B, T).astype(np.int64))
    pixels = torch.from_numpy(np.fromfile(os.path.join(work, "pixels.bin"), dtype="<f4").reshape(B, 3, S, S))
    pixels = pixels.double()
    with torch.no_grad():
        image = image_features(vcfg, w, pixels)
        text = text_features(tcfg, w, ids)
        loss = float(clip_loss(image, text, w["logit_scale"]))
    image.numpy().astype("<f8").tofile(os.path.join(work, "image_features.bin"))
    text.numpy().astype("<f8").tofile(os.path.join(work, "text_features.bin"))
    with open(os.path.join(work, "loss.txt"), "w") as f:
        f.write(f"{loss:.17g}\n")
    check_with_transformers(hf_dir, pixels, ids, image, text, loss)
    return 0


if __name__ == "__main__":
    sys.exit(main())
