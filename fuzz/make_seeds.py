#!/usr/bin/env python3
"""make_seeds.py: write the seed corpora of the fuzz targets, one folder per target, under OUT_DIR.

    fuzz/make_seeds.py OUT_DIR [CONFIGS_DIR]

Every seed is built here from the input layouts documented at the top of each fuzz_*.cpp (valid files of each
format, so that mutation starts past the magic numbers and length checks), plus the project's own configs/*.yaml
for fuzz_config, and config.dict. The fuzz CMakeLists.txt runs this at build time; nothing is downloaded or checked in.
"""
import pathlib
import struct
import sys


def le(fmt, *values):
    return struct.pack("<" + fmt, *values)


def megatron_idx(lengths, doc_indices, dtype_code, itemsize):
    """A Megatron MMIDIDX v1 index (engine/data/megatron_source.cpp)."""
    b = b"MMIDIDX\0\0" + le("Q", 1) + bytes([dtype_code]) + le("QQ", len(lengths), len(doc_indices))
    b += b"".join(le("i", n) for n in lengths)
    ptr = 0
    for n in lengths:
        b += le("q", ptr)
        ptr += n * itemsize
    return b + b"".join(le("q", d) for d in doc_indices)


def llmc_shard(tokens):
    header = le("iii", 20240520, 1, len(tokens)) + bytes(1024 - 12)
    return header + b"".join(le("H", t) for t in tokens)


def u16(tokens):
    return b"".join(le("H", t) for t in tokens)


def data_input(format_byte, seq_byte, split_byte, first, second=b""):
    """fuzz_data.cpp's layout: 3 control bytes, u16 length of the first file, the files."""
    return bytes([format_byte, seq_byte, split_byte]) + le("H", len(first)) + first + second


def data_seeds():
    tokens = [(i * 7 + 3) % 300 for i in range(40)]
    small = [i % 250 for i in range(24)]
    yield "megatron_u16", data_input(0, 3, 0, megatron_idx([10, 20, 10], [0, 1, 3], 8, 2), u16(tokens))
    i32 = b"".join(le("i", t * 1000) for t in small)
    yield "megatron_i32", data_input(0 | 1 << 3, 4, 1, megatron_idx([12, 12], [0, 2], 4, 4), i32)
    yield "llmc_one", data_input(1, 5, 2, llmc_shard(tokens))
    yield "llmc_two", data_input(1 | 1 << 2 | 2 << 3, 2, 0, llmc_shard(small), llmc_shard(tokens))
    yield "nanogpt_one", data_input(2, 7, 1, u16(tokens))
    yield "nanogpt_two", data_input(2 | 1 << 2 | 1 << 3, 0, 3, u16(small), u16(tokens))


def config_seeds(configs_dir):
    for path in sorted(pathlib.Path(configs_dir).glob("*.yaml")):
        yield "file_" + path.stem, path.read_bytes()
    # the loader's features: references, environment defaults, aliases, nulls, lists, overrides (NUL-separated)
    yield "references", (b"run:\n  name: r${run.seed}\n  output_dir: ${HOME:-/tmp}/runs/${run.name}\n"
                         b"logging:\n  metrics_file: ${run.output_dir}/m.jsonl\n")
    yield "aliases", (b"mixed_precision:\n  bf16: true\nparallel:\n  use_distributed_optimizer: true\n"
                      b"\0mixed_precision.bf16=false\0parallel.tensor_model_parallel_size=2")
    yield "nulls", b"model:\n  ffn_hidden_size: null\n  max_position_embeddings: auto\n  vocab_size: ~\n"
    yield "lists", b"data:\n  source: llmc\n  data_path: [a/*.bin, b.bin]\n  split: 1,0,0\n"
    yield "overrides", (b"model:\n  num_layers: 4\n\0model.num_layers=2\0data.data_path=[x, y]"
                        b"\0run.name=$${literal}\0training.global_batch_size=64")
    yield "empty", b""
    # small valid models, so that mutations of one number reach validate_config's arithmetic quickly
    yield "small_model", (b"model:\n  num_layers: 2\n  hidden_size: 64\n  num_attention_heads: 4\n  seq_length: 32\n"
                          b"  vocab_size: 100\nparallel:\n  tensor_model_parallel_size: 1\n"
                          b"  pipeline_model_parallel_size: 1\ntraining:\n  micro_batch_size: 2\n  train_iters: 10\n")
    yield "small_sets", (b"\0model.hidden_size=96\0parallel.tensor_model_parallel_size=2\0training.micro_batch_size=4"
                         b"\0model.make_vocab_size_divisible_by=128")
    # numbers mode (0xFF, then {key index, i64le value} records): a few numeric keys at small values
    yield "numbers", b"\xff" + b"".join(bytes([k]) + le("q", v) for k, v in ((3, 2), (7, 64), (11, 4), (20, 1), (30, 8)))
    yield "small_interleaved", (b"model:\n  num_layers: 4\n  hidden_size: 32\n  num_attention_heads: 2\n"
                                b"parallel:\n  pipeline_model_parallel_size: 2\n  pipeline_schedule: interleaved_1f1b\n"
                                b"  virtual_pipeline_model_parallel_size: 2\ntraining:\n  micro_batch_size: 1\n  global_batch_size: 16\n")


# fuzz_config's dictionary (libFuzzer's format, with \xNN and \" escapes): boundary numbers for the int, int64 and
# float keys, and the loader's syntax; the key names come from the seeds.
CONFIG_DICT = ["2147483647", "2147483648", "-2147483648", "4294967296", "65536", "46341", "9223372036854775807",
               "18446744073709551615", "1e308", "1e-320", "-0", "0", "null", "auto", "~", "true", "false",
               "${", "$${", "}", ":-", "${run.name}", "${HOME}", "${UNSET_FUZZ_VAR:-", "[", "]", "{", ",",
               ": ", r"\x0A  ", r"\x00", "&a ", "*a", "<<: ", "!!str ", "'", r"\"", "---", "..."]


def safetensors_file(tensors, metadata=None):
    """tensors: [(name, dtype, shape, nbytes)]; data bytes are zero."""
    header, offset = [], 0
    for name, dtype, shape, nbytes in tensors:
        header.append('"%s":{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}' % (
            name, dtype, str(list(shape)).replace(" ", ""), offset, offset + nbytes))
        offset += nbytes
    if metadata:
        header.append('"__metadata__":{%s}' % ",".join('"%s":"%s"' % kv for kv in metadata.items()))
    text = ("{" + ",".join(header) + "}").encode()
    return le("Q", len(text)) + text, offset


def safetensors_seeds():
    # fuzz_safetensors.cpp: byte 0 even -> the whole file; odd -> JSON header + u16 zero-byte count
    tensors = [("a.weight", "F32", (2, 3), 24), ("b", "BF16", (4,), 8), ("c", "I32", (), 4), ("d", "U8", (0,), 0)]
    full, nbytes = safetensors_file(tensors, {"format": "pt", "step": "7"})
    yield "whole_file", b"\0" + full + bytes(nbytes)
    header, nbytes = safetensors_file(tensors[:2])
    yield "header_only", b"\1" + header[8:] + struct.pack(">H", nbytes)
    yield "empty_header", b"\1{}" + struct.pack(">H", 0)


def buddy_seeds():
    # fuzz_buddy.cpp: min_block byte, u16 capacity, then 4-byte ops (even op: allocate, odd: free)
    yield "alloc_free", bytes([1, 0, 63]) + bytes([0, 0, 100, 4, 2, 1, 0, 0, 1, 0, 0, 0, 0, 2, 0, 3])
    yield "many", bytes([0, 1, 0]) + bytes([(i * 37) % 256 for i in range(256)])


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[1])
    configs = sys.argv[2] if len(sys.argv) == 3 else pathlib.Path(__file__).resolve().parent.parent / "configs"
    for target, seeds in (("data", data_seeds()), ("config", config_seeds(configs)),
                          ("safetensors", safetensors_seeds()), ("buddy", buddy_seeds())):
        d = out / target
        d.mkdir(parents=True, exist_ok=True)
        for name, content in seeds:
            (d / name).write_bytes(content)
    (out / "config.dict").write_text("".join('"%s"\n' % v for v in CONFIG_DICT))


if __name__ == "__main__":
    main()
