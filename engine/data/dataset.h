// dataset.h: token sources (Megatron .bin/.idx, llm.c shards, nanoGPT .bin, synthetic Markov language) and the
// deterministic sampler that turns them into (inputs, targets) micro-batches.
//
// A TokenSource is one flat stream of token ids (documents concatenated, as Megatron's GPTDataset and nanoGPT
// treat them). Sample s of a split is the window of seq_length + 1 tokens starting at token
// split_begin + s * seq_length; inputs are its first seq_length tokens, targets its last seq_length.
// The order in which samples are visited is a pure function of (seed, source fingerprint, global sample
// index) -- a seeded bijection per epoch, no stored permutation -- so the whole data state is
// consumed_samples and resume works under any data-parallel size (docs/design.md invariant 3).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/data/epoch_order.h"

namespace ms {

class TokenSource {
  public:
    virtual ~TokenSource() = default;
    virtual int64_t num_tokens() const = 0;
    // tokens [offset, offset + count) as int32
    virtual void read(int64_t offset, int64_t count, int32_t* out) const = 0;
    // smallest vocabulary that holds every id (validated when opened), or the declared one
    virtual int vocab_size() const = 0;
    // nats per token of the source when known (synthetic Markov chain), else NaN
    virtual double entropy_rate() const = 0;
    // one line for the log: format, path(s), tokens, vocab
    virtual std::string describe() const = 0;
    // a 64-bit fingerprint of the contents' identity, mixed into the order: format + file sizes + the first and
    // last 16 tokens for files (not the path: moved files keep their order), the language parameters for synthetic
    virtual uint64_t fingerprint() const = 0;
    // ids -> printable text for samples: bytes for byte-level data, the alphabet for the synthetic language
    virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
};

// Opens data.source with data.data_path. Throws UserError naming the file and what is wrong (missing, bad magic,
// bad version, sizes that disagree, token id >= vocab_limit when vocab_limit > 0, ...).
std::unique_ptr<TokenSource> open_token_source(const DataConfig& cfg, int vocab_limit);

enum class Split : uint8_t { kTrain, kValid, kTest };

class Sampler {
  public:
    // seq_length: T. split weights from DataConfig::split ("969,30,1"). seed: run.seed.
    Sampler(const TokenSource& source, const std::string& split_weights, Split split, int seq_length, uint64_t seed);
    int64_t num_samples() const;  // per epoch; >= 1 or the constructor throws UserError with the sizes
    // Fill rows for global samples [first, first + count): inputs and targets are (count, T) int32.
    void fill(int64_t first, int64_t count, int32_t* inputs, int32_t* targets) const;
    // the sample index (within the split) visited at global position g
    int64_t sample_at(int64_t g) const;

  private:
    const TokenSource& source_;
    int seq_length_;
    int64_t begin_token_ = 0;  // first token of this split
    int64_t num_samples_ = 0;
    EpochOrder order_;  // keyed by (seed, source fingerprint, split)
};

// Byte-level tokenizer: ids 0..255 are bytes, 256 is end-of-document. vocab 257.
inline constexpr int kByteVocab = 257;
inline constexpr int kByteEod = 256;
std::vector<int32_t> byte_encode(const std::string& text);
std::string byte_decode(const std::vector<int32_t>& ids);  // EOD -> "\n", other ids >= 256 -> "?"

// preprocess: text file -> Megatron <prefix>_text_document.{bin,idx} (uint16), documents separated by blank
// lines, EOD appended to each. Returns the number of documents and tokens. Throws UserError on I/O errors.
struct PreprocessStats {
    int64_t documents = 0;
    int64_t tokens = 0;
    std::string prefix;  // the written prefix (without .bin/.idx)
};
PreprocessStats preprocess_text(const std::string& input_path, const std::string& output_prefix);

}  // namespace ms
