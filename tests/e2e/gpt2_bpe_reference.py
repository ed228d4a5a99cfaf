#!/usr/bin/env python3
"""gpt2_bpe_reference.py: OpenAI's GPT-2 encoder (encoder.py: bytes_to_unicode, the `regex` pre-tokenizer, merges
by rank), the reference for the BPE test in tests/e2e/test_hf_interop.cpp.

Usage: python3 gpt2_bpe_reference.py VOCAB_JSON MERGES_TXT IN_JSON OUT_JSON   (exits 77 without the `regex` module)
IN_JSON is a list of strings; OUT_JSON gets the list of their id lists.
"""
import json
import sys

try:
    import regex as re
except ImportError as e:
    print(f"gpt2_bpe_reference.py: cannot import regex ({e})", file=sys.stderr)
    sys.exit(77)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def get_pairs(word):
    return {(word[i], word[i + 1]) for i in range(len(word) - 1)}


def bpe(token, ranks):  # encoder.py's Encoder.bpe
    word = tuple(token)
    pairs = get_pairs(word)
    if not pairs:
        return word
    while True:
        bigram = min(pairs, key=lambda pair: ranks.get(pair, float("inf")))
        if bigram not in ranks:
            break
        first, second = bigram
        new_word = []
        i = 0
        while i < len(word):
            try:
                j = word.index(first, i)
                new_word.extend(word[i:j])
                i = j
            except ValueError:
                new_word.extend(word[i:])
                break
            if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                new_word.append(first + second)
                i += 2
            else:
                new_word.append(word[i])
                i += 1
        word = tuple(new_word)
        if len(word) == 1:
            break
        pairs = get_pairs(word)
    return word


def main():
    vocab_path, merges_path, in_path, out_path = sys.argv[1:5]
    with open(vocab_path, encoding="utf-8") as f:
        encoder = json.load(f)
    with open(merges_path, encoding="utf-8") as f:
        lines = f.read().split("\n")[1:-1]
    ranks = {tuple(line.split()): i for i, line in enumerate(lines)}
    byte_encoder = bytes_to_unicode()
    pat = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
    with open(in_path, encoding="utf-8") as f:
        texts = json.load(f)
    out = []
    for text in texts:
        ids = []
        for token in re.findall(pat, text):
            token = "".join(byte_encoder[b] for b in token.encode("utf-8"))
            ids.extend(encoder[t] for t in bpe(token, ranks))
        out.append(ids)
    with open(out_path, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
