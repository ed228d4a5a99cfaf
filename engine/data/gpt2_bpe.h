// gpt2_bpe.h: GPT-2's byte-level BPE tokenizer (vocab.json + merges.txt, the files the Hugging Face hub ships with
// every GPT-2 model), for `generate` prompts and outputs.
//
// Encoding, as OpenAI's encoder.py and Hugging Face's GPT2Tokenizer do it:
//   1. pre-tokenize the UTF-8 text with the pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (first alternative that matches at the current position, as a backtracking regex engine picks it);
//   2. map each byte of a piece to one printable code point (bytes_to_unicode: the printable Latin-1 bytes
//      '!'..'~', '¡'..'¬', '®'..'ÿ' map to themselves, the other 68 bytes to U+0100.. in byte order);
//   3. start from one symbol per byte and repeatedly merge every occurrence of the adjacent pair with the lowest
//      rank in merges.txt (line order), until no pair has a rank;
//   4. look every symbol up in vocab.json.
// Decoding concatenates the symbols of the ids and maps the code points back to bytes.
//
// The same model also loads from a Hugging Face tokenizer.json (from_tokenizer_json, tokenizer_json.cpp): a
// byte-level BPE whose pre-tokenizer is GPT-2's pattern above or Llama-3's (tiktoken's cl100k pattern)
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with the model's ignore_merges (a pre-token that is itself in the vocabulary is one id, merges or not) and
// its added tokens, which are split out of the text first, as Hugging Face does (vocab.json + merges.txt encode
// them as text, as GPT-2's encoder.py does). No template tokens (a BOS) are added.
//
// Character classes: exact for ASCII (letters a-z A-Z, numbers 0-9, whitespace \t \n \v \f \r and space). Beyond
// ASCII this is an approximation of Unicode's \p{L} / \p{N}: every non-ASCII code point counts as a letter except
// the Unicode White_Space code points (U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F,
// U+3000), which count as whitespace. Non-ASCII digits and punctuation (e.g. '²', '—', '«') are thus grouped with
// adjacent letters, where GPT-2 would split them: the ids still decode to the same text, but may differ from
// Hugging Face's for such text. Invalid UTF-8 bytes are taken one byte at a time as letters.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ms {

class Gpt2Bpe {
  public:
    // Reads vocab.json ({"token": id, ...}) and merges.txt ("#version" header optional, then "left right" per line).
    // Throws UserError (exit code 2) naming the file, the line and the problem: a missing or unreadable file, a
    // vocab that is not a JSON object of non-negative integer ids, duplicate ids, a merge line without exactly
    // two symbols.
    static Gpt2Bpe load(const std::string& vocab_json_path, const std::string& merges_path);
    // The same from the files' contents; `label` names them in error messages.
    static Gpt2Bpe from_strings(std::string_view vocab_json, std::string_view merges, const std::string& label);
    // A Hugging Face tokenizer.json (tokenizer_json.cpp). Throws UserError naming the file and the field for
    // what this encoder does not reproduce: a model other than BPE, a normalizer, a pre-tokenizer other than the
    // two above, a prefix space, subword prefixes or suffixes, dropout.
    static Gpt2Bpe from_tokenizer_json(const std::string& path);

    enum class PreTokenizer : uint8_t { kGpt2, kLlama3 };

    // Throws UserError naming the symbol when a BPE symbol of the text is not in the vocabulary (a vocabulary
    // without all 256 byte symbols).
    std::vector<int32_t> encode(std::string_view text) const;
    // Pre-token -> its ids, kept by a caller (one per thread) across encode calls: natural text repeats its
    // words, and a pre-token's ids never change. The same ids as without it.
    using PieceCache = std::unordered_map<std::string, std::vector<int32_t>>;
    std::vector<int32_t> encode(std::string_view text, PieceCache& cache) const;
    // Ids without a vocabulary entry decode to U+FFFD.
    std::string decode(const std::vector<int32_t>& ids) const;

    // The pre-tokenization of step 1, exposed for tests.
    static std::vector<std::string> pretokenize(std::string_view text);
    static std::vector<std::string> pretokenize_llama3(std::string_view text);
    // The BPE symbols (in the byte-to-unicode alphabet) of one pre-token, after step 3.
    std::vector<std::string> bpe(std::string_view piece) const;

    int vocab_size() const { return max_id_ + 1; }  // one more than the largest id
    // The end-of-document id: "<|endoftext|>" (GPT-2's 50256) when the vocabulary has it; for a tokenizer.json,
    // the eos_token of the tokenizer_config.json beside it, else the first of the special added tokens
    // <|endoftext|>, <|end_of_text|>, </s>, <eos>.
    std::optional<int32_t> end_of_document() const;
    size_t num_merges() const { return ranks_.size(); }

  private:
    void encode_piece(const std::string& piece, std::vector<int32_t>& ids) const;  // appends the piece's ids
    void encode_text(std::string_view text, PieceCache* cache, std::vector<int32_t>& ids) const;  // appends
    // encode_text between the added tokens of split_tokens_, which are their ids.
    std::vector<int32_t> encode_split(std::string_view text, PieceCache* cache) const;

    std::unordered_map<std::string, int32_t> encoder_;  // symbol string (UTF-8) -> id
    std::unordered_map<int32_t, std::string> decoder_;
    std::unordered_map<std::string, int> ranks_;  // "left right" -> rank (merge line order; symbols hold no space)
    int32_t max_id_ = -1;
    PreTokenizer pre_tokenizer_ = PreTokenizer::kGpt2;
    bool ignore_merges_ = false;
    std::string end_of_document_ = "<|endoftext|>";
    // A tokenizer.json's added tokens, longest first: where one starts in the text (the leftmost, the longest
    // there) it is its id, as Hugging Face splits them out before pre-tokenizing.
    std::vector<std::pair<std::string, int32_t>> split_tokens_;
};

}  // namespace ms
