// clip_eval.h: the held-out evaluation of a CLIP model (model.arch: clip) -- zero-shot top-1/top-5 accuracy from
// clip.templates (prompt ensembling) and image->text / text->image recall@1/@5 (retrieval.h) on the first
// clip.eval_samples held-out samples -- which the trainer (clip_train.h) runs every eval.eval_interval iterations and
// at the end, and `mindspeed-train eval` runs on a checkpoint (run_clip_eval); and the image-text data both read.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/ckpt/checkpoint.h"
#include "engine/clip/clip_model.h"
#include "engine/clip/clip_shape.h"
#include "engine/clip/retrieval.h"
#include "engine/config/config.h"
#include "engine/data/image_text.h"

namespace ms {

enum class ClipSplit : uint8_t { kTrain, kHeldOut };

// The pairs of a split. data.source shapes: the drawn training split, or the drawn held-out split of
// clip.eval_samples images (another Philox stream). data.source webdataset: the shards of data.data_path or of
// clip.eval_data_path (UserError naming the key when it is empty).
std::unique_ptr<ImageTextSource> open_clip_source(const Config& cfg, const ClipShape& shape, ClipSplit split);

// Sample `index` of `source` at S x S, or the first good one after it while bad samples are skipped
// (clip.skip_bad_samples): the order stays a function of the data and the index. UserError when every sample is bad.
void read_clip_sample(const ImageTextSource& source, int64_t index, int S, ImageTextSample& out);

// b rows of zero pixels and kClipPad tokens.
ClipBatch empty_clip_batch(const ClipShape& shape, int b);
// Sample s into row i of `batch`: its pixels and its caption's tokens (clip_tokenize).
void add_to_clip_batch(ClipBatch& batch, int i, const ImageTextSample& s, const ClipShape& shape);

struct ClipHeldOut {
    clip::ZeroShotAccuracy zero_shot;           // count 0 when the source has no classes
    std::vector<clip::RetrievalRecall> recall;  // @1, @5
    int64_t samples = 0;
    // With cross-modal layers: the matching head's accuracy and loss on the pairs of each whole batch of b samples
    // (hard negatives drawn as in training, Philox seed 0, stream 0, index the held-out sample), averaged over the
    // batches; matching_pairs 0 when there is none.
    clip::ItmLossResult matching;
    int64_t matching_pairs = 0;
};

// Zero-shot accuracy, recall (and the matching head's accuracy) on the first min(cc.eval_samples, held_out.size())
// samples of `held_out`, encoded in batches of b (the model's). Every data-parallel replica computes all of it (the set
// is small), so no rank waits for another's features.
ClipHeldOut evaluate_held_out(ClipModel& model, const ImageTextSource& held_out, const ClipConfig& cc, int b);

// "held-out N samples: zero-shot top-1 X% top-5 Y% (M labelled images) | image->text R@1 ... | ... [| matching
// accuracy Z% (P pairs)]": the trainer's log line after the iteration, and eval's.
std::string describe_held_out(const ClipHeldOut& h);

// The metrics record of an evaluation after iteration `iteration` (logging.metrics_file): {"eval": true,
// "iteration", "samples", "zero_shot_top1" and "zero_shot_top5" (when the source has classes; top-5 with 5 or more),
// "image_to_text_r1", "text_to_image_r1", "image_to_text_r5", "text_to_image_r5", and with matching pairs
// "itm_accuracy", "itm_loss", "itm_pairs"}; fractions in [0, 1].
nlohmann::json held_out_record(const ClipHeldOut& h, int64_t iteration);

// `mindspeed-train eval` for model.arch: clip: the held-out evaluation of the model `reader` holds, as the trainer runs
// it (evaluate_held_out in batches of training.micro_batch_size, mixed_precision.dtype), on one rank, tensor-parallel
// size 1, the CPU backend, whatever layout saved it (its canonical tensors read whole). cfg: the config of the model,
// its parallel section, run.backend and training.global_batch_size ignored; config_name names it in errors. The
// checkpoint's model must be the config's: otherwise UserError(kExitConfigError) naming each clip: key that differs
// with both values. Logs "eval: iteration N | " and describe_held_out; returns held_out_record(reader.iteration()) with
// "checkpoint": reader.dir().
nlohmann::json run_clip_eval(Config cfg, const CheckpointReader& reader, const std::string& config_name);

}  // namespace ms
