// preprocess.h: `preprocess` -- documents (a text file, or Megatron's JSON Lines input) tokenized into Megatron
// <prefix>_<key>_document.{bin,idx} datasets (the format is in megatron_source.cpp).
//
// Input: plain text (json_keys empty): documents are maximal runs of non-blank lines, joined by '\n', one dataset
// under the key "text". JSON Lines (json_keys given): one JSON object per line (blank lines skipped); each key's
// value (a string, or a list of strings that are concatenated, as Megatron's preprocess_data.py takes them) is
// one document of that key's dataset.
// Tokens: the tokenizer's ids of each document, then its end-of-document id with append_eod. Documents without
// tokens are skipped (counted). Token dtype: uint16 (code 8) below 65500 ids, else int32 (code 4), Megatron's rule.
// Workers: batches of documents are encoded by `workers` threads and written in input order, so the output is
// the same bytes for every number of workers.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/data/gpt2_bpe.h"
#include "engine/data/progress.h"

namespace ms {

struct DocumentTokenizer {
    std::string name;  // as --tokenizer-type spells it
    // Called from several threads at once, each with its own cache.
    std::function<std::vector<int32_t>(std::string_view, Gpt2Bpe::PieceCache&)> encode;
    int64_t vocab_size = 0;
    std::optional<int32_t> end_of_document;
    bool always_end_documents = false;  // the byte tokenizer: EOD after every document, --append-eod or not
};

enum class TokenizerType : uint8_t { kByte, kGpt2Bpe, kHuggingFace };
// "byte", "GPT2BPETokenizer", "HuggingFaceTokenizer"; throws UserError listing the three for another name.
TokenizerType parse_tokenizer_type(const std::string& name);
// The byte tokenizer (dataset.h: ids 0..255, EOD 256), GPT-2's BPE from vocab_file + merge_file, or a
// tokenizer.json (tokenizer_model). Throws UserError naming the missing flag or the unreadable file.
DocumentTokenizer load_document_tokenizer(TokenizerType type, const std::string& vocab_file,
                                          const std::string& merge_file, const std::string& tokenizer_model);

struct PreprocessOptions {
    std::string input;
    std::string output_prefix;
    std::vector<std::string> json_keys;  // empty: plain text
    bool append_eod = false;
    int workers = 1;
    Progress::Style progress = Progress::Style::kNone;
};

struct PreprocessOutput {
    std::string key;
    std::string prefix;  // <output_prefix>_<key>_document, without .bin/.idx
    int64_t documents = 0;
    int64_t empty_documents = 0;  // skipped: no tokens
    int64_t tokens = 0;
};

// Throws UserError naming the file (and the line of a JSON Lines input) on unreadable or malformed input.
std::vector<PreprocessOutput> preprocess(const PreprocessOptions& options, const DocumentTokenizer& tokenizer);

}  // namespace ms
