#!/usr/bin/env python3
"""hf_tokenizers_reference.py: Hugging Face `tokenizers` as the reference for `preprocess`
(tests/e2e/test_preprocess.cpp). Exits 77 when the `tokenizers` package is not importable.

  make DIR
      Trains two tiny byte-level BPEs on a fixed corpus and writes
        DIR/gpt2/tokenizer.json, DIR/gpt2/vocab.json, DIR/gpt2/merges.txt  (GPT-2's pre-tokenizer, <|endoftext|>)
        DIR/llama3/tokenizer.json  (Llama-3's Split pattern + ByteLevel, ignore_merges, the vocabulary filled with
                                    unused tokens up to 128000 ids, then the added tokens <|begin_of_text|> 128000
                                    and <|end_of_text|> 128001, as Llama 3 numbers them)
  check TOKENIZER_JSON PREFIX TEXTS_JSON EOD
      Reads the Megatron dataset PREFIX.{bin,idx} as Megatron's indexed_dataset.py does (header, dtype code,
      sequence lengths and pointers) and checks that document i holds the ids of tokenizer.encode(texts[i],
      add_special_tokens=False) followed by the id of the token EOD (none: nothing). Prints the first difference and exits 1.
"""
import json
import os
import struct
import sys
from array import array

try:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers, decoders
except ImportError as e:
    print(f"hf_tokenizers_reference.py: cannot import tokenizers ({e})", file=sys.stderr)
    sys.exit(77)

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog didn't move; it's lazy, isn't it?",
    "Numbers: 1, 12, 123, 1234, 12345 and 3.14159 or -42 -- they're all here.",
    "We'll see what they've done!!! (Parentheses) [brackets] {braces} <angle> and \"quotes\".",
    "  Leading spaces\tand\ttabs\n\nparagraphs\r\nwindows lines   trailing   ",
    "café über naïve façade déjà vu, Ünïcödé letters in words: Zürich, São Paulo, Kraków.",
    "tokenization tokenizer tokens token tokenized retokenize; the other hand, another, other",
    "def main():\n    return 0  # code with indentation\n\n\n    x = y + z * 2\n",
] * 20


def bpe_model(**kwargs):
    try:
        return models.BPE(ignore_merges=True, **kwargs) if kwargs.pop("ignore_merges", False) else models.BPE(**kwargs)
    except TypeError:  # a tokenizers release before ignore_merges
        return models.BPE(**kwargs)


def train(tok, vocab_size, special):
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.decoder = decoders.ByteLevel()
    return tok


def make(out):
    os.makedirs(f"{out}/gpt2", exist_ok=True)
    gpt2 = Tokenizer(bpe_model())
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    train(gpt2, 420, ["<|endoftext|>"])
    gpt2.save(f"{out}/gpt2/tokenizer.json")
    gpt2.model.save(f"{out}/gpt2")  # vocab.json + merges.txt, GPT2BPETokenizer's files

    os.makedirs(f"{out}/llama3", exist_ok=True)
    llama = Tokenizer(bpe_model(ignore_merges=True))
    llama.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    train(llama, 450, [])
    spec = json.loads(llama.to_str())
    vocab = spec["model"]["vocab"]  # filled up to 128000 ids, so that the added tokens get Llama 3's ids
    vocab.update({f"<|unused_{i}|>": i for i in range(len(vocab), 128000)})
    spec["added_tokens"] = [
        {"id": 128000 + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True} for i, c in enumerate(["<|begin_of_text|>", "<|end_of_text|>"])]
    loaded = Tokenizer.from_str(json.dumps(spec))  # the file must load in Hugging Face's tokenizers, ids as given
    assert loaded.token_to_id("<|end_of_text|>") == 128001
    with open(f"{out}/llama3/tokenizer.json", "w") as f:
        json.dump(spec, f)


def read_megatron(prefix):
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    assert idx[:9] == b"MMIDIDX\x00\x00", "bad magic"
    version, = struct.unpack_from("<Q", idx, 9)
    code, = struct.unpack_from("<B", idx, 17)
    n_seq, n_doc = struct.unpack_from("<QQ", idx, 18)
    assert version == 1
    typecode = {8: "H", 4: "i"}[code]  # Megatron's DType codes: 8 uint16, 4 int32
    lengths = array("i", idx[34:34 + 4 * n_seq])
    pointers = array("q", idx[34 + 4 * n_seq:34 + 12 * n_seq])
    documents = array("q", idx[34 + 12 * n_seq:34 + 12 * n_seq + 8 * n_doc])
    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    item = array(typecode).itemsize
    seqs = [list(array(typecode, data[p:p + item * n])) for p, n in zip(pointers, lengths)]
    return [sum(seqs[documents[d]:documents[d + 1]], []) for d in range(n_doc - 1)]


def check(tokenizer_json, prefix, texts_json, eod):
    tok = Tokenizer.from_file(tokenizer_json)
    with open(texts_json) as f:
        texts = json.load(f)
    docs = read_megatron(prefix)
    if len(docs) != len(texts):
        print(f"{prefix}: {len(docs)} documents, expected {len(texts)}")
        return 1
    for i, (doc, text) in enumerate(zip(docs, texts)):
        expected = tok.encode(text, add_special_tokens=False).ids + ([] if eod == "none" else [tok.token_to_id(eod)])
        if doc != expected:
            print(f"{prefix}: document {i} ({text!r}) holds\n  {doc}\nHugging Face gives\n  {expected}")
            return 1
    print(f"{prefix}: {len(docs)} documents equal Hugging Face's ids")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
        sys.exit(0)
    sys.exit(check(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]))
