// checkpoint.h: training checkpoints -- save, auto-resume, and a reader of canonical tensors -- under any layout
// (docs/design.md §8, docs/formats.md). atomic_dir.h does the commit protocol.
//
// On disk (format version 1; every *.safetensors holds F32 tensors in C order):
//
//   <save>/latest_checkpointed_iteration.txt        "1000", written last (Megatron's tracker)
//   <save>/iter_0001000/
//     manifest.json          the commit marker: format/version, world_size, tp, pp, dp, virtual_pipeline,
//                            zero_stage, sequence_parallel, config_hash, the model's dims, and "files": every
//                            other file with its size and XXH64 (CheckpointWriter::commit)
//     train_state.json       TrainState below (iteration, consumed samples, counters, optimizer step, lr schedule,
//                            data fingerprint)
//     config.resolved.yaml   the run's resolved config, for people (loading never reads it)
//     model/tp{tt:02d}_pp{ppp:03d}.safetensors     written by dp rank 0 of each (tp, pp)
//     optim/dp{dddd:04d}_tp{tt:02d}_pp{ppp:03d}.safetensors   zero_stage 1: every rank; zero_stage 0: dp rank 0
//
// Model files. Tensor names are canonical (ParamInfo::name: "wte.weight", "h.3.attn.c_attn.weight", ...), weights
// in Linear orientation (out, in), each holding THIS rank's shard in its local shape. Every piece of every tensor
// is stored exactly once across all files: replicated tensors (wpe, LayerNorms, row-parallel biases) only by tp
// rank 0, and the last pipeline stage's copy of the tied wte not at all (it equals the first stage's bit for bit:
// both receive the same embd-summed gradient). Before anything is written, the save counts the elements all ranks
// will store (model and optimizer) against the whole model's (a cheap form of Megatron's
// validate_sharding_integrity: the boxes are disjoint by construction, so equal counts mean no gap); the loader
// checks every element it reads is stored exactly once (CheckpointReader::read_box).
//
// The model is described by a CheckpointModel (below): its whole table and its manifest "model" object. GPT-2 and
// Llama are checkpoint_model(GptShape); CLIP (model.arch clip: two towers and logit_scale, pp 1, no vocab_rows tensor)
// is engine/clip/clip_checkpoint.h's, whose manifest holds the resolved clip: shape and "vocab_size" (its text
// vocabulary, kClipTextVocab). Everything else in this file is the same for every model.
//
// Where a piece goes: file __metadata__ (string -> string, as the format requires) holds
//   "format": "mindspeed-ckpt", "format_version": "1", "kind": "model" | "optim", "tp_rank", "tp_size", "pp_rank",
//   "pp_size", "dp_rank", "dp_size", "vocab_size" (the real vocabulary V)
// and, per tensor, under the tensor's own name a JSON object (as a string):
//   {"global_shape": [3C, C],          the canonical tensor
//    "view_shape": [3, C, C],           a logical view of it in which every shard is a box (C-order identical
//                                       to global_shape: the same bytes)
//    "view_offset": [0, r*C/tp, 0],     the shard's box in the view ...
//    "view_extent": [3, C/tp, C],       ... whose C-order bytes are the stored tensor's
//    "range": [a, b]}                   optimizer pieces only: elements [a, b) of that box (C order)
// The view is the global shape except for c_attn, whose per-head tensor-parallel split (rank r holds
// [Q_heads(r) | K_heads(r) | V_heads(r)]) is a box of the (3, C, C) weight / (3, C) bias view. wte's first dim is
// the padded vocabulary Vp of the saving layout (a multiple of make_vocab_size_divisible_by * tp); rows >= V are
// zero, so a layout with another Vp loads rows [0, V) and zero-fills the rest.
//
// onebit_adam adds its error feedback to the optimizer files, per parameter like the moments: the servers' residuals
// as "onebit_server_error/<name>" slices (each chunk has one server, so they tile the tensor once, whatever the
// layout), and each dp rank's own worker residuals, whole tensors, as "onebit_worker_error_dpNNNN/<name>" (NNNN its
// dp rank). A resume at the same data-parallel size reads its own rank's; at another size every rank starts from
// the mean of the saved ranks' residuals, which keeps their sum over ranks, what the average owes.
//
// Optimizer files. ZeRO-1 shards the flat buffer, not tensors: a rank's range [shard_begin, +S) cuts parameters
// anywhere, so its state is stored per parameter as the 1-D slices "exp_avg/<name>" and "exp_avg_sq/<name>" with
// "range" = the slice's elements within the parameter's local shard (the box above). Any other layout finds the
// elements of its own range by intersecting boxes and ranges (CheckpointReader). zero_stage 0 holds the whole
// state replicated on every dp rank, so dp rank 0 saves it (range = the whole shard). No separate master copy is
// stored: the model files hold the fp32 parameters, which are the master weights in every precision; a bf16/fp16
// run's 16-bit weights are those rounded to nearest even (Gpt::refresh_weights), so nothing is lost, a resume is
// exact, and the files load as fp32 into any precision (2 bytes per parameter more than 16-bit model files, 2 less
// than 16-bit model files plus Megatron's separate fp32 master slices). With sharded master weights
// (distributed_optimizer.h) the dp ranks gather their master shards for the save into the buffer the model lends
// (its gradients, free between steps), so the files are the same as with whole masters and any layout loads them.
// The AdamW step count (bias correction) is TrainState::optimizer_step.
//
// No RNG state is saved: weights are initialised from Philox by global element index, there is no dropout, and the
// data order is a pure function of (seed, source fingerprint, global sample index), so the whole data state is
// consumed_samples (docs/design.md invariants 1, 3). Same layout, same config => the resumed run continues bit for bit.
//
// Save (collective over world, at a step boundary): all ranks agree on the iteration (min/max all-reduce), rank 0
// creates <save>/iter_X.tmp/, every rank writes its files there, rank 0 commits (manifest, directory rename,
// tracker last), then removes checkpoints beyond checkpoint.keep_latest_k. Every phase ends in a one-int
// all-reduce that makes a failure on any rank a failure on all: every rank throws UserError(kExitCheckpoint) -- the
// failing one with its own sentence -- and the tracker still names the previous checkpoint. All ranks write into
// one directory: a multi-node run needs `save` on a shared filesystem.
//
// Startup (open_save_dir and check_no_newer_checkpoint, before the first step): `save` must be writable with room
// for one checkpoint on every rank that writes; world rank 0 holds its lock (<save>/mindspeed-train.lock) for the
// run and removes what crashed saves left; and no committed checkpoint there may be newer than where the run starts.
//
// Load: rank 0 picks and verifies the checkpoint (verify_on_load: full reads every file once, on rank 0), then
// every rank opens every model/ and optim/ file (mmap + header parse) and copies the boxes it needs. Opening all
// files on all ranks is O(ranks^2) header reads: fine for the tens of ranks this runs on today; a manifest index
// of tensor -> files would bound it for large jobs.
//
// Fault injection, for tests: MS_INJECT_CKPT_FAIL=<phase>[@<world rank>] makes the save throw
// UserError(kExitCheckpoint) at that phase: "write" (after this rank wrote its model file, before its optimizer
// file), "manifest" (files written and digested, no manifest yet), "rename" (manifest written, directory not yet
// renamed), "tracker" (directory committed, tracker not yet written). The last three happen on rank 0 only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_groups.h"
#include "engine/ckpt/save_dir.h"
#include "engine/config/config.h"
#include "engine/model/gpt.h"
#include "engine/optim/loss_scaler.h"

namespace ms {

class DistributedOptimizer;
class SafetensorsFile;

inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr const char* kTrainStateFile = "train_state.json";
inline constexpr const char* kResolvedConfigFile = "config.resolved.yaml";

// train_state.json: everything besides tensors that a resume needs, plus what it checks.
struct TrainState {
    int64_t iteration = 0;         // completed iterations; the next one is iteration + 1
    int64_t consumed_samples = 0;  // the whole data state (the sampler is a pure function of the global index)
    int64_t skipped_iterations = 0;
    int64_t nan_iterations = 0;
    int64_t optimizer_step = 0;  // AdamW steps taken (bias correction); < iteration when steps were skipped
    // at most this many per iteration: 1 for a language model or CLIP, selfplay.train_steps for self-play (absent in
    // older files: 1)
    int64_t optimizer_steps_per_iteration = 1;
    // The lr schedule is a pure function of (config, iteration) (learning_rate() in adamw.h); these are the values
    // it was computed from, so that a resume under a changed schedule says so.
    std::string lr_decay_style;
    double lr = 0, min_lr = 0;
    int64_t lr_warmup_iters = 0;
    int64_t lr_decay_iters = 0;  // resolved: 0 in the config means train_iters, stored here as that number
    double last_lr = 0;          // the learning rate of iteration `iteration`
    uint64_t seed = 0;
    // The data identity: xxh64 hex of (TokenSource::fingerprint, split, seq_length, seed), and describe() for the
    // message when it changes.
    std::string data_fingerprint;
    std::string data_describe;
    // fp16's dynamic loss scaling (engine/optim/loss_scaler.h); {1, 0, 0} otherwise
    LossScalerState loss_scaler;
};

nlohmann::json train_state_to_json(const TrainState& s);
TrainState train_state_from_json(const nlohmann::json& j, const std::string& where);  // UserError naming `where`

// The data identity stored in TrainState::data_fingerprint.
std::string data_fingerprint(uint64_t source_fingerprint, const DataConfig& data, int seq_length, uint64_t seed);

// The model a checkpoint holds, as the format needs it whatever the model family: what a save writes into the
// manifest, what a load and a reader compare the files against, and what a save's room is sized by.
struct CheckpointModel {
    // The whole model's parameter table at tp 1 (pp 1): canonical names and global shapes, in model order. A padded
    // vocabulary's tensors (ParamInfo::vocab_rows) have the padded rows of the saving layout.
    std::vector<ParamInfo> whole_table;
    // The manifest's "model" object: "arch" (absent: gpt), the family's dims, and "vocab_size", which the reader needs.
    nlohmann::json manifest;
    int vocab_size = 0;  // the files' "vocab_size" metadata: the real vocabulary V of the vocab_rows tensors

    int64_t num_params() const;  // the elements of whole_table
};

// GPT-2 or Llama (shape.arch): gpt_param_table(shape) and model_manifest(shape).
CheckpointModel checkpoint_model(const GptShape& shape);

// One rank's live training state: what a save reads and a load overwrites. All references must outlive the call.
struct CheckpointContext {
    const Config& cfg;  // resolved (vocab filled in)
    CheckpointModel model;
    const ProcessGroups& groups;
    const std::vector<ParamInfo>& params_info;  // this rank's table: canonical names, shards, flat offsets
    float* params;  // the flat fp32 parameter buffer the table indexes (sharded masters: lent, pipeline.h params())
    DistributedOptimizer& optimizer;
    // Files of the model family's own state that world rank 0 writes into the checkpoint directory (given as the
    // argument) with train_state.json: the commit lists and digests them with the rest (self-play's replay buffer).
    std::function<void(const std::string& dir)> write_extra = {};
};

// Writes iteration `state.iteration` to cfg.checkpoint.save (see the top of this file), then applies
// checkpoint.keep_latest_k. Collective over groups.world; call it at a step boundary, on every rank. Returns the
// committed directory (on every rank). Throws UserError(kExitCheckpoint) on every rank if any rank failed.
std::string save_checkpoint(const CheckpointContext& ctx, const TrainState& state);

// The manifest's "model" object for a model of this shape: the dims, the vocabulary, and the family ("arch": "gpt" or
// "llama"; Llama adds num_query_groups, rotary_base and rope_scaling), whether the output layer is untied.
// checkpoint_shape reads it back.
nlohmann::json model_manifest(const GptShape& shape);
// The bytes of tensor data in one checkpoint of this model: every parameter (num_params) once as an F32 weight
// (model/) and twice as F32 AdamW moments (optim/). The safetensors headers and JSON files add a little.
int64_t checkpoint_tensor_bytes(const CheckpointModel& model);

// checkpoint.save at startup, before training, so that a run does not train save_interval iterations only to fail at
// its first save. Not collective: call it on every rank and make the ranks agree on the outcome (the trainer's
// on_every_rank_or_none) before the next collective. Nothing (nullptr) when checkpoint.save is empty. Every rank
// that writes checkpoint files (the model's, the optimizer's, the commit's) creates the directory and a file in it,
// and needs room there for one whole checkpoint (checkpoint_tensor_bytes: with `save` on one shared filesystem,
// every rank's files land on the same disk); otherwise UserError (kExitConfigError) naming the directory and the
// numbers. Room for one checkpoint but not two is a warning when the run saves periodically: a save writes the new
// checkpoint before retention removes an old one, so the second save would fail. World rank 0, which creates,
// commits and removes checkpoints, then takes the directory's lock (save_dir.h SaveDirLock: a second run saving
// there is refused, a dead run's lock taken over) and cleans what crashed saves left (clean_uncommitted); it returns
// the lock, to hold for the run.
std::unique_ptr<SaveDirLock> open_save_dir(const CheckpointContext& ctx);

// After the resume: a save never replaces a committed checkpoint. With checkpoint.load the same directory as
// checkpoint.save the resume took the newest one that verifies, so the run's saves come after it; otherwise, when
// checkpoint.save holds a checkpoint that is complete by its sizes (verify_checkpoint quick) and newer than
// `start_iteration` (the resumed iteration, 0 from scratch), the run is refused (UserError, kExitConfigError) on
// world rank 0: its saves would replace that checkpoint, or retention would delete this run's by iteration number.
// A checkpoint that failed verification at the resume may be replaced by the save of its iteration. Not collective,
// like open_save_dir.
void check_no_newer_checkpoint(const CheckpointContext& ctx, int64_t start_iteration);

// Auto-resume from cfg.checkpoint.load. Collective over groups.world.
//   - load empty: nullopt (fresh start).
//   - the directory does not exist or holds no committed checkpoint (only iter_X.tmp leftovers, or nothing):
//     logs "starting from scratch" and returns nullopt.
//   - otherwise rank 0 picks the newest checkpoint that verifies (find_latest_committed: a warning names each newer
//     one skipped and a stale tracker; checkpoint.verify_on_load: quick = sizes, full = XXH64 too), and every
//     rank loads its own shard of the parameters and of the optimizer state from it, whatever layout saved it.
//     A directory whose committed checkpoints all fail verification is an error (19), not a fresh start.
// Errors, on every rank: a tensor whose global shape differs from the configured model's, or a tensor missing from
// either side -> UserError(kExitConfigError) naming the first such tensor in model order with both shapes (the
// checkpoint is intact; the config disagrees with it); unreadable or inconsistent files -> kExitCheckpoint.
// A changed data fingerprint (`data_fingerprint` of this run vs train_state.json) is a warning naming both sources.
std::optional<TrainState> load_checkpoint(const CheckpointContext& ctx, const std::string& fingerprint);

// Which optimizer state a CheckpointReader returns.
enum class OptimState : uint8_t { kExpAvg, kExpAvgSq };
const char* optim_state_name(OptimState s);  // "exp_avg", "exp_avg_sq"

// Where a TP rank's shard of a parameter lies in the tensor's logical view (see the top of this file).
struct ShardBox {
    std::vector<int64_t> view_shape;   // the whole tensor as the view sees it
    std::vector<int64_t> view_offset;  // the shard's first element in the view
    std::vector<int64_t> view_extent;  // the shard's size per view dim (product = ParamInfo::numel)
};
ShardBox shard_box(const ParamInfo& p, int tp_rank, int tp_size);

class CheckpointReader;
// The first tensor, in model order, that `model` and the checkpoint disagree on (missing on either side, or another
// global shape; a vocab_rows tensor compares the real vocabulary and the width, not the padding) as
// UserError(kExitConfigError) naming it with both shapes. `what` names the model in the message ("the configured
// model"); `hint` is what the user should do, after "HINT: the checkpoint holds model {...}; ".
void check_checkpoint_shape(const CheckpointReader& r, const CheckpointModel& model, const std::string& what,
                            const std::string& hint);
// The same for the GPT-2 or Llama model of `shape` (checkpoint_model(shape)).
void check_checkpoint_shape(const CheckpointReader& r, const GptShape& shape, const std::string& what,
                            const std::string& hint);

struct CanonicalTensor {
    std::string name;
    std::vector<int64_t> shape;  // global shape, e.g. (3C, C); wte: (Vp of the saving layout, C)
    std::vector<float> data;     // C order, Linear orientation
};

// A committed checkpoint directory opened for reading, in any layout: for `convert`, `eval`, `generate`, and the
// load above. Opens (mmaps) every model/ and optim/ file and indexes their pieces by canonical name. Does not
// verify checksums: call verify_checkpoint() (atomic_dir.h) or pick the directory with latest() first.
class CheckpointReader {
  public:
    // dir: <save>/iter_XXXXXXX. Throws UserError(kExitCheckpoint) naming the file when a file is missing, not a
    // valid safetensors file, or lacks the per-tensor metadata.
    explicit CheckpointReader(const std::string& dir);
    ~CheckpointReader();
    CheckpointReader(CheckpointReader&&) noexcept;
    CheckpointReader& operator=(CheckpointReader&&) noexcept;

    // <save>/iter_XXXXXXX of the checkpoint to resume from (find_latest_committed), or nullopt when none.
    static std::optional<std::string> latest(const std::string& save_dir, bool verify_checksums);

    const std::string& dir() const { return dir_; }
    const nlohmann::json& manifest() const { return manifest_; }
    const TrainState& train_state() const { return state_; }
    int64_t iteration() const { return state_.iteration; }
    int vocab_size() const { return vocab_size_; }  // the real vocabulary V (wte rows >= V are padding)

    // Canonical model tensor names in model order (wte, wpe, h.0.*, ..., ln_f.*).
    const std::vector<std::string>& names() const { return names_; }
    bool contains(const std::string& name) const;
    // False for a model-only checkpoint (no optim/ files: `convert --from hf-gpt2`); a resume from one starts the
    // optimizer from zero state.
    bool has_optimizer_state() const { return has_state("exp_avg") || has_state("exp_avg_sq"); }
    // Whether optimizer state of this kind is stored: "exp_avg", "exp_avg_sq", onebit_adam's "onebit_server_error"
    // and "onebit_worker_error_dpNNNN" (one per saving dp rank).
    bool has_state(const std::string& kind) const { return optim_pieces_.count(kind) != 0; }
    const std::vector<int64_t>& global_shape(const std::string& name) const;  // UserError if absent

    // The whole tensor assembled from every shard. Throws UserError(kExitCheckpoint) if absent or not fully covered.
    CanonicalTensor tensor(const std::string& name) const;
    // The whole AdamW state of a parameter, the same way (a model-only checkpoint has none: UserError).
    CanonicalTensor optimizer_state(const std::string& name, OptimState which) const;

    // Elements [begin, end) (C order) of `box` of tensor `name` into out[0 .. end-begin): the model values
    // (which == nullopt) or optimizer state. box.view_shape may exceed the saved view (a larger padded vocabulary):
    // elements outside the saved tensor are zero. Every element inside it must be stored exactly once, else
    // UserError(kExitCheckpoint) naming the tensor. Returns how many elements came from the checkpoint.
    int64_t read_box(const std::string& name, std::optional<OptimState> which, const ShardBox& box, int64_t begin,
                     int64_t end, float* out) const;
    // The same for optimizer state of any kind (has_state()).
    int64_t read_state_box(const std::string& name, const std::string& kind, const ShardBox& box, int64_t begin,
                           int64_t end, float* out) const;

  private:
    struct Piece {  // one stored shard (model) or slice (optimizer) of a tensor
        const SafetensorsFile* file;
        std::string key;                   // the tensor's name in that file
        std::vector<int64_t> view_offset;  // the stored box in the tensor's view
        std::vector<int64_t> view_extent;
        int64_t begin = 0, end = 0;  // elements of the box held (C order): the whole box for model pieces
    };
    std::string dir_;
    nlohmann::json manifest_;
    TrainState state_;
    int vocab_size_ = 0;
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::vector<std::string> names_;
    std::map<std::string, std::vector<int64_t>> shapes_;       // name -> global shape
    std::map<std::string, std::vector<int64_t>> view_shapes_;  // name -> view shape
    // model values: name -> pieces; optimizer state: kind -> name -> pieces
    std::map<std::string, std::vector<Piece>> model_pieces_;
    std::map<std::string, std::map<std::string, std::vector<Piece>>> optim_pieces_;
    int64_t read_pieces(const std::vector<Piece>* pieces, const std::string& name, const std::string& what,
                        const ShardBox& box, int64_t begin, int64_t end, float* out) const;
};

}  // namespace ms
