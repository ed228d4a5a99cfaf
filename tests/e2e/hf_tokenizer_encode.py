#!/usr/bin/env python3
"""hf_tokenizer_encode.py: Hugging Face `tokenizers` loading the tokenizer.json of an export
(tests/e2e/test_hf_interop.cpp). Exits 77 when the `tokenizers` package is not importable.

Usage: hf_tokenizer_encode.py TOKENIZER_JSON TEXTS_JSON OUT_JSON
Writes OUT_JSON: {"ids": [ids of each text, add_special_tokens=False], "decoded": [decode(ids) of each],
"eos": id of the tokenizer_config.json's eos_token beside TOKENIZER_JSON, or null}, and, when `transformers` is
importable, "auto_ids": the ids of AutoTokenizer.from_pretrained(the directory of TOKENIZER_JSON), as users load an
export, and "auto_eos": its eos_token_id.
"""
import json
import os
import sys

try:
    from tokenizers import Tokenizer
except ImportError as e:
    print(f"hf_tokenizer_encode.py: cannot import tokenizers ({e})", file=sys.stderr)
    sys.exit(77)


def main(tokenizer_json, texts_json, out_json):
    tok = Tokenizer.from_file(tokenizer_json)
    with open(texts_json) as f:
        texts = json.load(f)
    encoded = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    eos = None
    config = os.path.join(os.path.dirname(tokenizer_json), "tokenizer_config.json")
    if os.path.exists(config):
        with open(config) as f:
            name = json.load(f).get("eos_token")
        eos = tok.token_to_id(name) if name else None
    out = {"ids": encoded, "decoded": [tok.decode(ids) for ids in encoded], "eos": eos}
    try:
        from transformers import AutoTokenizer
    except ImportError:
        AutoTokenizer = None
    if AutoTokenizer is not None:
        auto = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(tokenizer_json)))
        out["auto_ids"] = [auto(t, add_special_tokens=False)["input_ids"] for t in texts]
        out["auto_eos"] = auto.eos_token_id
    with open(out_json, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
