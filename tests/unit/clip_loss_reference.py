#!/usr/bin/python3
"""clip_loss_reference.py: CLIP's contrastive loss and its autograd gradients in PyTorch, the reference for
tests/unit/test_contrastive_loss.cpp (engine/clip/contrastive_loss.h).

Usage: /usr/bin/python3 tests/unit/clip_loss_reference.py WORK_DIR   (exits 77 if torch/numpy are missing)

The loss is open_clip's ClipLoss (open_clip/loss.py) with gather_with_grad=True and local_loss=True, written out for
`world` ranks inside one process: rank r holds rows r*b .. r*b+b-1 of the N = world*b rows, its "gathered" features
are the whole (N, D) tensors (so autograd carries every rank's loss back to every row, as the all-gather with
gradient does), its labels are arange(b) + b*r, and its loss is
    (cross_entropy(s * img_r @ txt_all.T, labels) + cross_entropy(s * txt_r @ img_all.T, labels)) / 2.
Features are normalised first (F.normalize, as open_clip's model does) and s = exp(clamp(p, max=log(max_logit_scale)))
(CLIP's clamp; torch.clamp passes no gradient above the bound).

Outputs, per case c, computed in float64 from the float32 inputs:
  loss_c.txt         the mean over ranks of the local losses (the global mean loss), one line
  dimage_c.bin, dtext_c.bin   float64 (N, D): d(sum over ranks of local losses)/d(features), what each rank's
                     features receive after the gather's backward (a reduce-scatter of sums)
  dlogit_c.txt       the mean over ranks of d(local loss)/dp, one line

Input in WORK_DIR: cases.json {"N", "D", "max_logit_scale", "cases": [{"logit_scale_param", "world"}, ...]};
image.bin, text.bin: float32 (N, D).
"""
import json
import math
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"clip_loss_reference.py: cannot import numpy and torch ({e})", file=sys.stderr)
    sys.exit(77)


def local_loss(image_features, text_features, all_image, all_text, logit_scale, rank):
    """open_clip ClipLoss.forward's loss for one rank with local_loss=True."""
    logits_per_image = logit_scale * image_features @ all_text.T
    logits_per_text = logit_scale * text_features @ all_image.T
    labels = torch.arange(logits_per_image.shape[0], dtype=torch.long) + logits_per_image.shape[0] * rank
    return (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2


def run_case(image, text, p, world, max_logit_scale):
    N = image.shape[0]
    assert N % world == 0, (N, world)
    b = N // world
    x_img = torch.tensor(image, dtype=torch.float64, requires_grad=True)
    x_txt = torch.tensor(text, dtype=torch.float64, requires_grad=True)
    param = torch.tensor(p, dtype=torch.float64, requires_grad=True)
    img = F.normalize(x_img, dim=-1)
    txt = F.normalize(x_txt, dim=-1)
    scale = torch.clamp(param, max=math.log(max_logit_scale)).exp()
    losses = [
        local_loss(img[r * b : (r + 1) * b], txt[r * b : (r + 1) * b], img, txt, scale, r) for r in range(world)
    ]
    total = sum(losses)
    total.backward()
    # d(sum of local losses)/dp over world is the mean over ranks of d(local loss)/dp times world.
    return float(total.item()) / world, x_img.grad.numpy(), x_txt.grad.numpy(), float(param.grad.item()) / world


def main():
    work = sys.argv[1]
    with open(os.path.join(work, "cases.json")) as f:
        spec = json.load(f)
    N, D = spec["N"], spec["D"]
    image = np.fromfile(os.path.join(work, "image.bin"), dtype="<f4").reshape(N, D)
    text = np.fromfile(os.path.join(work, "text.bin"), dtype="<f4").reshape(N, D)
    for c, case in enumerate(spec["cases"]):
        loss, dimage, dtext, dlogit = run_case(
            image, text, case["logit_scale_param"], case["world"], spec["max_logit_scale"]
        )
        with open(os.path.join(work, f"loss_{c}.txt"), "w") as f:
            f.write(f"{loss:.17g}\n")
        with open(os.path.join(work, f"dlogit_{c}.txt"), "w") as f:
            f.write(f"{dlogit:.17g}\n")
        dimage.astype("<f8").tofile(os.path.join(work, f"dimage_{c}.bin"))
        dtext.astype("<f8").tofile(os.path.join(work, f"dtext_{c}.bin"))


if __name__ == "__main__":
    main()
