// hf_tokenizer.h: the tokenizer files of a Hugging Face export (convert --to hf-gpt2), so that transformers'
// AutoTokenizer.from_pretrained(dir) and tokenizers' Tokenizer.from_file(dir + "/tokenizer.json") load the tokenizer
// the model's data was preprocessed with.
//
// A checkpoint does not record its tokenizer (preprocess writes token ids only), so the export is given what
// preprocess was given:
//   byte (preprocess's default)          tokenizer.json stating the byte tokenizer in Hugging Face's terms: a
//                                        ByteLevel pre-tokenizer without regex (the whole text is one piece, its
//                                        bytes mapped to GPT-2's byte alphabet), a BPE whose vocabulary is those 256
//                                        symbols with their byte values as ids and no merges, <|endoftext|> = 256
//                                        as a special added token; so the ids are the UTF-8 bytes.
//                                        tokenizer_config.json naming PreTrainedTokenizerFast and <|endoftext|> as
//                                        bos/eos.
//   GPT-2 BPE (vocab_file + merge_file)  vocab.json and merges.txt, copied; tokenizer.json built from them (GPT-2's
//                                        layout: BPE model, ByteLevel pre-tokenizer with GPT-2's regex and no prefix
//                                        space, ByteLevel decoder, <|endoftext|> as a special added token);
//                                        tokenizer_config.json naming GPT2Tokenizer and <|endoftext|> as bos/eos/unk.
//   tokenizer.json (tokenizer_json)      copied, with the tokenizer_config.json and special_tokens_map.json beside it
//                                        when there are such files, else a tokenizer_config.json naming
//                                        PreTrainedTokenizerFast and the end-of-document token as eos.
// The BPE files are first loaded with the encoder preprocess uses (Gpt2Bpe), so a file it would refuse is refused
// here with the same sentence; every tokenizer's ids must fit the model's vocabulary.
// Hugging Face splits a special added token out of the text ("<|endoftext|>" written in a document is one id);
// preprocess encodes it as text with vocab.json + merges.txt (as GPT-2's encoder.py does) and the byte tokenizer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/data/preprocess.h"

namespace ms {

struct HfTokenizerSource {
    std::optional<TokenizerType> type;   // none: from the files given (or no tokenizer, when none is)
    std::string vocab_file, merge_file;  // GPT-2 BPE (both)
    std::string tokenizer_json;          // a Hugging Face tokenizer.json
    bool empty() const { return !type && vocab_file.empty() && merge_file.empty() && tokenizer_json.empty(); }
};

struct HfTokenizerExport {
    std::string kind;                     // "byte-level", "GPT-2 BPE" or "tokenizer.json"
    int64_t vocab_size = 0;               // one more than the largest id
    std::optional<int32_t> eos_token_id;  // the end-of-document id, when the tokenizer has one
    std::vector<std::string> files;       // written into out_dir
};

// Checks `src` (the files its type needs and no others; loadable; largest id < model_vocab_size)
// and writes its files into out_dir (atomically). model_max_length is the model's positions. Throws UserError
// (kExitConfigError) naming the flag, the file or both sizes.
HfTokenizerExport export_hf_tokenizer(const HfTokenizerSource& src, int64_t model_vocab_size, int64_t model_max_length,
                                      const std::string& out_dir);

}  // namespace ms
