#!/usr/bin/env python3
"""hf_shard.py: sharded Hugging Face directories from the Python side, for tests/e2e/test_hf_interop.cpp.

Usage: hf_shard.py split SRC_DIR DST_DIR N     (standard library only)
Copies SRC_DIR/config.json and splits SRC_DIR/model.safetensors into DST_DIR/model-0000i-of-0000N.safetensors,
tensor k (in name order) going to shard k mod N, so that every shard holds tensors from all over the model. Each
shard is written as a minimal writer would: the JSON header unpadded (so tensor data is not 8-byte aligned), tensors
in reverse name order. DST_DIR/model.safetensors.index.json is what save_pretrained writes:
json.dumps({"metadata": {"total_size": BYTES}, "weight_map": {...}}, indent=2, sort_keys=True).

Usage: hf_shard.py plan CASES_JSON OUT_JSON     (exits 77 without huggingface_hub)
CASES_JSON is [{"sizes": [bytes of each tensor, in order], "max": max_shard_size}, ...]; OUT_JSON gets, per case,
the shards huggingface_hub's split_state_dict_into_shards_factory (what save_pretrained calls) makes of them, in
file order, as lists of tensor indices.
"""
import json
import os
import shutil
import sys


def plan(cases_json, out_json):
    try:
        from huggingface_hub.serialization import split_state_dict_into_shards_factory
    except ImportError as e:
        print(f"hf_shard.py: cannot import huggingface_hub ({e})", file=sys.stderr)
        return 77
    with open(cases_json) as f:
        cases = json.load(f)
    out = []
    for case in cases:
        state_dict = {f"t{i}": size for i, size in enumerate(case["sizes"])}
        split = split_state_dict_into_shards_factory(state_dict, get_storage_size=lambda size: size,
                                                     filename_pattern="model{suffix}.safetensors",
                                                     max_shard_size=case["max"])
        out.append([[int(key[1:]) for key in split.filename_to_tensors[name]]
                    for name in sorted(split.filename_to_tensors)])
    with open(out_json, "w") as f:
        json.dump(out, f)
    return 0


def split(src, dst, n):
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
    if sys.argv[1] == "plan":
        sys.exit(plan(sys.argv[2], sys.argv[3]))
    sys.exit(split(sys.argv[2], sys.argv[3], int(sys.argv[4])))
