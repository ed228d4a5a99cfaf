// file_source.h: the TokenSource shared by the file formats (Megatron .bin, llm.c shards, nanoGPT .bin), and the
// per-format openers that validate a file and hand its token region to it.
//
// A FileTokenSource is an ordered list of segments, each a memory-mapped file whose tokens start at
// `header_bytes` and are stored as little-endian uint16 or int32. The flat stream is the segments concatenated:
// global token i lives in the segment s with starts_[s] <= i < starts_[s + 1]. The maps are read-only and shared
// by every reader; nothing is copied at open except the one validation scan (max id / first id >= vocab_limit).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/data/dataset.h"
#include "engine/data/mapped_file.h"

namespace ms::data {

enum class TokenDtype : uint8_t { kUint16, kInt32 };
inline int itemsize(TokenDtype d) { return d == TokenDtype::kUint16 ? 2 : 4; }
inline const char* dtype_name(TokenDtype d) { return d == TokenDtype::kUint16 ? "uint16" : "int32"; }

struct TokenSegment {
    MappedFile file;
    size_t header_bytes = 0;  // tokens start here
    TokenDtype dtype = TokenDtype::kUint16;
    int64_t num_tokens = 0;
};

// Result of one pass over a segment's tokens.
struct TokenScan {
    int32_t max_id = -1;
    int64_t bad_index = -1;  // first token (within the segment) that is < 0 or >= vocab_limit; -1 if none
    int64_t bad_value = 0;
};
TokenScan scan_tokens(const TokenSegment& seg, int vocab_limit);

// "token id 50304 ... is >= the vocabulary size 50257" and the hint, for a bad id found by scan_tokens;
// `where` locates it ("token 17 of 'x.bin' (sequence 3)").
[[noreturn]] void throw_bad_token(const TokenScan& scan, const std::string& where, int vocab_limit);

class FileTokenSource final : public TokenSource {
  public:
    // `description` is the describe() line; `format` is mixed into the fingerprint. max_id from scan_tokens.
    FileTokenSource(std::string format, std::string description, std::vector<TokenSegment> segments, int32_t max_id);

    int64_t num_tokens() const override { return starts_.back(); }
    void read(int64_t offset, int64_t count, int32_t* out) const override;
    int vocab_size() const override { return max_id_ + 1; }
    double entropy_rate() const override;
    std::string describe() const override { return description_; }
    uint64_t fingerprint() const override { return fingerprint_; }
    std::string decode(const std::vector<int32_t>& ids) const override;

  private:
    std::string format_;
    std::string description_;
    std::vector<TokenSegment> segments_;
    std::vector<int64_t> starts_;  // (segments + 1) first global token of each segment, then the total
    int32_t max_id_ = -1;
    uint64_t fingerprint_ = 0;
};

// Per-format openers (validate, scan, build). Each throws UserError naming the file, the problem and a hint.
std::unique_ptr<TokenSource> open_megatron(const DataConfig& cfg, int vocab_limit);
std::unique_ptr<TokenSource> open_llmc(const DataConfig& cfg, int vocab_limit);
std::unique_ptr<TokenSource> open_nanogpt(const DataConfig& cfg, int vocab_limit);
std::unique_ptr<TokenSource> open_synthetic(const SyntheticConfig& cfg, int vocab_limit);

// data_path entries expanded with glob(3) (sorted, duplicates removed); a pattern that matches nothing is an error.
std::vector<std::string> expand_paths(const std::vector<std::string>& patterns, const std::string& format);

// "1.2 MB" style sizes for describe() lines and messages
std::string human_bytes(uint64_t bytes);

}  // namespace ms::data
