// image_text.h: image-caption sources for contrastive (CLIP) training, and the order in which samples are visited.
//
// A source holds samples 0..size()-1; read(i, S) returns sample i as an S x S image, channel-major RGB normalised
// with CLIP's mean and std, plus its caption and (when the source knows it) a class label. Two sources:
// - synthetic shapes: procedurally drawn coloured shapes with captions ("a red circle left of a blue square"); a
//   sample is a pure function of (seed, split, index), at any S.
// - WebDataset: POSIX/GNU tar shards whose members are grouped into samples by key (the member path up to the
//   first '.' of its file name), each with an image (.jpg/.png/.jpeg) and a .txt caption, optionally a .cls label.
//   Shards are indexed at open (member offsets and sizes) and read with pread at read time.
//
// Every image, whatever its size, goes through one pipeline: decode to 8-bit RGB, resize the shorter side to S
// (antialiased when shrinking), centre-crop to S x S, normalise.
//
// The order (ImageTextOrder) is a pure function of (seed, source fingerprint, global sample index), a seeded
// bijection per epoch that is never stored, so the whole data state is the number of samples consumed and resume
// works under any data-parallel size (as for token data, dataset.h).
//
// Threading: read() may be called concurrently for different i; a source's only mutable state is atomic.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/data/epoch_order.h"

namespace ms {

// CLIP's normalisation (OpenAI): x -> (x / 255 - mean) / std per channel.
inline constexpr std::array<float, 3> kClipMean = {0.48145466f, 0.4578275f, 0.40821073f};
inline constexpr std::array<float, 3> kClipStd = {0.26862954f, 0.26130258f, 0.27577711f};

struct ImageTextSample {
    std::string key;            // "shard-000.tar:000123" style: names the sample in errors and logs
    std::vector<float> pixels;  // (3, S, S) channel-major RGB, normalised ((x/255 - mean) / std)
    std::string caption;        // UTF-8, whitespace-trimmed
    int label = -1;  // class index when the source knows it (single-object synthetic images, `.cls`), else -1
};

class ImageTextSource {
  public:
    virtual ~ImageTextSource() = default;
    virtual int64_t size() const = 0;  // samples
    // class names for zero-shot classification ("red circle", "seven"); may be empty
    virtual const std::vector<std::string>& classes() const = 0;
    // Sample i at S x S: decoded, shorter side resized to S (antialiased when shrinking), centre-cropped,
    // normalised. Returns false when the sample is bad and skip_bad_samples was set (counted in skipped());
    // otherwise a bad sample throws UserError naming the shard and key and what is wrong (corrupt image, empty
    // caption, image smaller than min_side, ...).
    virtual bool read(int64_t i, int S, ImageTextSample& out) const = 0;
    // Samples skipped: those dropped when the source was opened (a member missing, a damaged tar's last sample)
    // plus every read() that returned false. 0 unless skip_bad_samples was set.
    virtual int64_t skipped() const = 0;
    virtual std::string describe() const = 0;  // one log line
    // a 64-bit fingerprint of the contents' identity, mixed into the order (not the paths: moved files keep it)
    virtual uint64_t fingerprint() const = 0;
};

struct ImageTextOptions {
    int min_side = 1;               // smallest image width and height accepted (the patch size)
    bool skip_bad_samples = false;  // skip and count bad samples instead of throwing UserError
};

// Synthetic shapes: num_samples images of one or two coloured shapes; split 0 draws the training images, split 1
// different (held-out) ones. classes() is every "colour shape" pair.
std::unique_ptr<ImageTextSource> open_synthetic_shapes(uint64_t seed, int64_t num_samples, int split);

// WebDataset tar shards, in the order given (the order is part of the fingerprint). classes() comes from a
// classes.txt next to the first shard (one name per line) when there is one. Throws UserError naming the shard
// and what is wrong (missing, not a tar, damaged, no samples, a sample without image or caption unless skipped).
std::unique_ptr<ImageTextSource> open_webdataset(const std::vector<std::string>& shard_paths,
                                                 const ImageTextOptions& options);

// The order samples are visited in: global position g of the run -> sample index, epoch by epoch a seeded bijection
// keyed by (seed, the source's fingerprint) (epoch_order.h).
class ImageTextOrder {
  public:
    ImageTextOrder(const ImageTextSource& source, uint64_t seed);  // throws UserError when the source is empty
    int64_t sample_at(int64_t g) const { return order_.sample_at(g); }
    int64_t num_samples() const { return order_.size(); }  // per epoch

  private:
    EpochOrder order_;
};

}  // namespace ms
