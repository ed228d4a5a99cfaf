#!/usr/bin/env python3
"""hf_shard.py: a sharded Hugging Face directory written independently of the C++ writer, for the import test in
tests/e2e/test_hf_interop.cpp (standard library only).

Usage: hf_shard.py SRC_DIR DST_DIR N
Copies SRC_DIR/config.json and splits SRC_DIR/model.safetensors into DST_DIR/model-0000i-of-0000N.safetensors,
tensor k (in name order) going to shard k mod N, so that every shard holds tensors from all over the model. Each
shard is written as a minimal writer would: the JSON header unpadded (so tensor data is not 8-byte aligned), tensors
in reverse name order. DST_DIR/model.safetensors.index.json is what save_pretrained writes:
json.dumps({"metadata": {"total_size": BYTES}, "weight_map": {...}}, indent=2, sort_keys=True).
"""
import json
import os
import shutil
import sys


def main(src, dst, n):
    with open(os.path.join(src, "model.safetensors"), "rb") as f:
        data = f.read()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    meta = header.pop("__metadata__", None)
    base = 8 + size
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), os.path.join(dst, "config.json"))
    names = sorted(header)
    weight_map, total = {}, 0
    for s in range(n):
        shard = f"model-{s + 1:05d}-of-{n:05d}.safetensors"
        out_header, buffer = {}, b""
        if meta is not None:
            out_header["__metadata__"] = meta
        for name in reversed(names[s::n]):
            info = header[name]
            begin, end = info["data_offsets"]
            out_header[name] = {"dtype": info["dtype"], "shape": info["shape"],
                                "data_offsets": [len(buffer), len(buffer) + end - begin]}
            buffer += data[base + begin:base + end]
            weight_map[name] = shard
        text = json.dumps(out_header, separators=(",", ":")).encode()
        with open(os.path.join(dst, shard), "wb") as f:
            f.write(len(text).to_bytes(8, "little") + text + buffer)
        total += len(buffer)
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True))
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
