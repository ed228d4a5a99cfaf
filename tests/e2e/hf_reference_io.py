"""hf_reference_io.py: what the PyTorch references (hf_gpt2_reference.py, hf_llama_reference.py) share -- reading a
Hugging Face directory's weights as a consumer sees them (model.safetensors, or model.safetensors.index.json and each
tensor from the shard its weight_map names; the safetensors header parsed here, F32 / F16 / BF16 widened to float32),
and running a model over the samples a test wrote.

Samples in WORK_DIR: shape.json {"B", "T", "micro_batches"}; tokens.bin, targets.bin: int32 (micro_batches, B, T).
Output in WORK_DIR: logits.bin float32 (B, T, V) of micro-batch 0; loss.txt: the mean over micro-batches of each
micro-batch's mean cross-entropy (float32 forward, float64 average), one line.
The importer has checked that numpy and torch import (exit 77 otherwise).
"""
import json
import os

import numpy as np
import torch
import torch.nn.functional as F


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        raw = data[base + begin : base + end]
        if info["dtype"] == "BF16":  # the high half of a float32
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, dtype={"F32": "<f4", "F16": "<f2"}[info["dtype"]]).astype(np.float32)
        tensors[name] = torch.tensor(a.reshape(info["shape"]))
    return meta, tensors


def read_weights(hf_dir):
    """(metadata, {name: float32 tensor}) of the directory; a sharded one's index must name every tensor's shard and
    its total_size the F32 bytes (the exporter's dtype)."""
    single = os.path.join(hf_dir, "model.safetensors")
    if os.path.exists(single):
        return read_safetensors(single)
    with open(os.path.join(hf_dir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    weight_map, meta, tensors, nbytes = index["weight_map"], None, {}, 0
    for shard in sorted(set(weight_map.values())):
        meta, part = read_safetensors(os.path.join(hf_dir, shard))
        assert sorted(part) == sorted(k for k, v in weight_map.items() if v == shard), shard
        tensors.update(part)
        nbytes += sum(t.numel() * 4 for t in part.values())
    assert index["metadata"]["total_size"] == nbytes, (index["metadata"], nbytes)
    return meta, tensors


def run_samples(work, vocab_size, forward):
    """forward(tokens (B, T) int64) -> logits (B, T, vocab_size) over the samples in `work`; writes the outputs."""
    with open(os.path.join(work, "shape.json")) as f:
        shape = json.load(f)
    B, T, M = shape["B"], shape["T"], shape["micro_batches"]
    tokens = np.fromfile(os.path.join(work, "tokens.bin"), dtype="<i4").reshape(M, B, T)
    targets = np.fromfile(os.path.join(work, "targets.bin"), dtype="<i4").reshape(M, B, T)
    total = 0.0
    with torch.no_grad():
        for i in range(M):
            logits = forward(torch.from_numpy(tokens[i].astype(np.int64)))
            if i == 0:
                logits.numpy().astype("<f4").tofile(os.path.join(work, "logits.bin"))
            flat = logits.reshape(B * T, vocab_size)
            loss = F.cross_entropy(flat, torch.from_numpy(targets[i].astype(np.int64)).reshape(-1))
            total += float(loss.item())
    with open(os.path.join(work, "loss.txt"), "w") as f:
        f.write(f"{total / M:.17g}\n")
