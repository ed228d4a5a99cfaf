// grad_buckets.h: the data-parallel gradient reduction in buckets that start during the backward (Megatron's
// overlap_grad_reduce, parallel.overlap_grad_reduce).
//
// The flat gradient buffer is cut at parameter boundaries into buckets of at least bucket_elems elements, from its
// end down (the order in which the backward finishes parameters): bucket 0 holds the last parameters and the
// padding after them, the last bucket begins at element 0. During the step's last micro-batch the compiled programs
// say which gradients are final (graph::GradsFinalFn, after the op that last writes each); once every gradient of a
// bucket is, its sum of squares before the reduction is taken (the step boundary's NaN check, which must see this
// rank's own gradients) and its reduction (average over dp, background priority) is issued without waiting:
//   zero_stage 0  an all-reduce of the bucket (GradReduction::kAllReduce)
//   zero_stage 1  a reduce of each dp shard's part of the bucket into the rank that owns it (kToShardOwners): the
//                 shards keep the distributed optimizer's contiguous layout [d * S, (d + 1) * S), whatever the buckets
//                 (owner_parts() cuts a bucket at the shard boundaries), so checkpoints and resharding see no change.
// Gradients completed once per step after the backward (defer(): sequence parallelism's LayerNorm gradients, the
// tied embedding summed across pipeline stages) are final only in finish(), which issues every bucket still
// unissued in bucket order and waits for all of them.
//
// Every data-parallel rank runs the same programs in the same order, so the buckets are issued in the same order on
// every rank, as collectives on one communicator must be. Each element is averaged by the same all-reduce as with
// one flat buffer (zero_stage 1: by the same per-owner reduce the MPI communicator makes of the in-place
// reduce-scatter), only in pieces.
//
// The tied embedding (tie(), where the model keeps the output layer's gradient apart: GptGraphOptions::
// tied_grads_apart). Its gradient is the lookup's plus the output layer's. Summed in one buffer it is final only
// after the embedding's backward, the step's very last op, and for a GPT-2 vocabulary it is most of the bytes: its
// reduction would always wait at the end. Reduced apart, each part goes when it is final:
//   the output layer's  final after the last micro-batch's head, at the start of the backward: reduced like a
//                       bucket (all-reduce, or its shard owners' parts) -- on a pipeline's last stage it is the
//                       embedding's gradient in the flat buffer (tied with lookup false), reduced as it is final
//                       rather than with the first layers' bucket it lies in;
//   the lookup's        written only in the rows of the step's tokens (look_up()): once the forwards are done (the
//                       first report of the last micro-batch's backward) the ranks all-gather the rows each touched;
//                       when the lookup is final, the union's rows alone are all-reduced (rows x C: a few thousand
//                       rows, not the vocabulary), and finish() writes them back, the other rows being zero on every
//                       rank. Its bucket reduces the parameters around it.
// finish() then adds the two averages. Without overlap the sum is taken first and averaged after, so the tied
// embedding's gradient (and it alone) differs from it in rounding.
//
// A pipeline (TiedEmbedding::stages: the embedding group, this rank and the other end's of the same tp and dp ranks)
// holds the lookup on its first stage and the output layer on its last, and each needs the sum. The two averages
// cross the embedding group, each as soon as it is ready, instead of one all-reduce of the vocabulary table after
// the backward:
//   last stage   all-reduces the output layer's gradient over dp (every dp rank then holds the whole average) and,
//                as soon as that is done, sends the first stage the part its optimizer reads (all of it; with
//                zero_stage 1 its dp shard's part, in the first stage's flat layout): this goes while both stages'
//                last backwards run. finish() receives the union's row ids and rows and adds them.
//   first stage  receives that part into its head buffer (GptGraphOptions::tied_head_received), sends its union's
//                row ids and, once averaged, its rows (rows x C, not the vocabulary), and adds the received part.
// Each element is the same two averages added as on one stage (addition commutes), so a pipeline keeps one stage's
// bits; the elements no rank looked up are 0 + the head's there as well.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "engine/backends/backend.h"
#include "engine/graph/program.h"
#include "engine/model/gpt.h"

namespace ms {

// Megatron's default bucket size: max(40M, 1M x dp) elements.
int64_t default_bucket_elems(int dp);

// The buckets of a flat buffer [0, padded) whose parameters occupy `params` ([begin, end) each, sorted by begin), in
// bucket order: cut from the end down, each closed at the start of a parameter once it holds bucket_elems elements,
// the last one beginning at 0. Bucket 0 holds the last parameters and the padding after them. The step simulator
// (engine/sim/simulator.h) cuts the same buckets.
std::vector<std::pair<int64_t, int64_t>> bucket_ranges(std::span<const std::pair<int64_t, int64_t>> params,
                                                       int64_t padded, int64_t bucket_elems);

// bucket_ranges over a parameter table's elements (any order): the buckets GradBuckets cuts, and ParamGather gathers.
std::vector<std::pair<int64_t, int64_t>> param_bucket_ranges(const std::vector<ParamInfo>& table, int64_t padded,
                                                             int64_t bucket_elems);

// How a bucket is reduced over dp: all-reduced (zero_stage 0), or each shard's part reduced into its owner (1).
enum class GradReduction : uint8_t { kAllReduce, kToShardOwners };

// The part of [begin, end) in dp rank `owner`'s shard [owner * shard, (owner + 1) * shard).
struct OwnerPart {
    int owner;
    int64_t begin, end;
    bool operator==(const OwnerPart&) const = default;
};
// [begin, end) cut at the shard boundaries, in owner order (each part non-empty).
std::vector<OwnerPart> owner_parts(int64_t begin, int64_t end, int64_t shard);

class GradBuckets {
  public:
    // table: the rank's parameters (offsets into grads); padded: the flat buffer's length (its tail is zeros; with
    // kToShardOwners, padded / dp.size() is the shard); grads_dtype: the gradients' (fp32 or 16-bit), which the
    // reductions keep.
    GradBuckets(const std::vector<ParamInfo>& table, int64_t padded, int64_t bucket_elems, void* grads,
                Communicator& dp, Backend& backend, GradReduction reduction = GradReduction::kAllReduce,
                DType grads_dtype = DType::kF32);
    GradBuckets(const GradBuckets&) = delete;
    GradBuckets& operator=(const GradBuckets&) = delete;

    // These gradients are final only in finish() (reduced per step after the backward).
    void defer(std::span<const graph::GradRange> ranges);
    // The tied embedding's gradient, reduced apart (above). Before the first step.
    struct TiedEmbedding {
        graph::GradRange range;  // the embedding's gradient in the flat buffer: rows x row_elems
        int64_t row_elems = 0;   // the hidden size
        bool lookup = true;      // range holds the lookup's gradient; false: the output layer's alone (a pipeline's
                                 // last stage), reduced whole as soon as it is final
        int64_t first_row = 0;   // the vocabulary row of its first element (its tp shard's first)
        int64_t max_tokens = 0;  // tokens a step's forwards look up, at most
        Tensor head = {};        // the output layer's gradient kept apart on this rank (as range), or empty; with
                                 // stages and lookup, where the last stage's average arrives
        // A pipeline's first or last stage (lookup says which): the embedding group, of these two ranks; else null.
        Communicator* stages = nullptr;
        // With stages: where the embedding lies in the first stage's flat buffer, and that buffer's length (padded),
        // which say the elements the first stage's optimizer reads (zero_stage 1: its dp shard's part)
        graph::GradRange first_stage_range = {};
        int64_t first_stage_padded = 0;
    };
    void tie(const TiedEmbedding& tied);
    // The tokens a forward of the embedding looks up (every micro-batch of the step, before its backward).
    void look_up(std::span<const int32_t> tokens);
    // Before the step's first backward.
    void begin_step();
    // What the last micro-batch's backward reports: gradients final from now on, as ranges of a chunk whose
    // gradients start `base` elements into the flat buffer.
    void final(std::span<const graph::GradRange> ranges, int64_t base);
    // After the per-step reductions: issues the buckets still unissued and waits for every bucket.
    void finish();

    // The sum of the buckets' sums of squares before their reduction (finish() done), in bucket order, then the
    // tied embedding's lookup and head.
    double squares_before_reduction() const;
    bool tied() const { return tied_param_ >= 0; }  // tie() was called
    // The tied embedding's rows all-reduced in the last step (the union of every rank's tokens in this rank's shard).
    int64_t tied_rows() const { return static_cast<int64_t>(union_.size()); }
    // Issue order of this step's buckets (for tests and the timeline); bucket b covers [begin(b), end(b)).
    const std::vector<int>& issued() const { return issued_; }
    int num_buckets() const { return static_cast<int>(buckets_.size()); }
    int64_t begin(int b) const { return buckets_[static_cast<size_t>(b)].begin; }
    int64_t end(int b) const { return buckets_[static_cast<size_t>(b)].end; }

  private:
    struct Bucket {
        int64_t begin, end;   // elements of the flat buffer
        int64_t param_elems;  // of its parameters (the padding and gaps between them need no report)
        int64_t final_elems;  // reported so far this step
        double squares;       // before the reduction
        // what it reduces: [begin, end), or the two sides of a tied embedding inside it
        std::vector<std::pair<int64_t, int64_t>> dense;
        std::vector<OwnerPart> parts;  // one reduction each: the dense ranges (owner -1: all-reduced), or their
                                       // shard owners' parts
        std::vector<Handle> handles;   // one per part
    };
    void mark(std::span<const graph::GradRange> ranges, int64_t base, bool deferred_too);
    // The params_ entries [first, last) a reported range covers: one parameter, or several packed back to back that
    // the graph writes as one gradient tensor (Llama's q/k/v and gate/up projections). Fatal for anything else.
    std::pair<size_t, size_t> params_in(const graph::GradRange& r) const;
    // One reduction each: [begin, end) all-reduced (owner -1; none when empty), or its shard owners' parts.
    std::vector<OwnerPart> parts_of(int64_t begin, int64_t end) const;
    void set_parts(Bucket& b) const;
    void issue(int b);
    // the tied embedding: the gather of the rows each rank looked up, the union's rows, the head's reduction
    void issue_row_gather();
    void issue_rows();
    void issue_head();
    void finish_tied();
    // a pipeline's first stage: the output layer's average arrives from the last stage
    bool receives_head() const { return tied_.stages != nullptr && tied_.lookup; }
    static constexpr int kHeadTag = 0, kIdsTag = 1, kRowsTag = 2;  // in the embedding group
    // across the embedding group: the head's part the first stage reads, received there once the last micro-batch's
    // backward starts and sent by the last stage once its all-reduce is done; the sums each stage forms in finish()
    Handle transfer_head_part(P2POp::Kind kind, Priority p);
    void add_received_head();  // the first stage
    void add_received_rows();  // the last stage

    std::vector<Bucket> buckets_;
    std::vector<graph::GradRange> params_;  // sorted by begin
    std::vector<int> bucket_of_;            // per params_ entry
    std::vector<char> deferred_, done_;     // per params_ entry
    std::vector<graph::GradRange> deferred_ranges_;
    std::vector<int> issued_;
    GradReduction reduction_;
    Tensor grads_;  // (padded) flat, fp32 or 16-bit
    // tie(): the embedding's entry in params_ (-1: none), the rows this rank looked up this step (row indices in
    // its shard; looked_ flags them), sent padded to max_tokens with -1, the gather of every rank's, the union's
    // rows (sorted) and their gradients packed, and where each reduction stands this step
    TiedEmbedding tied_;
    int tied_param_ = -1;
    std::vector<int32_t> rows_, row_send_, row_gather_, union_;
    std::vector<char> looked_;
    std::vector<float> packed_;
    Handle gather_handle_, rows_handle_;
    std::vector<OwnerPart> head_parts_;  // of the head's buffer, one reduction each
    std::vector<Handle> head_handles_;
    // with stages: the elements of the embedding the first stage reads ([begin, end) from range.begin), the other
    // stage's rank in the group, the union's row ids (padded with -1 to as many as the union can hold) sent or
    // received, and the head's transfer of this step
    int64_t part_begin_ = 0, part_end_ = 0;
    int peer_ = -1;
    std::vector<int32_t> stage_ids_;
    Handle head_transfer_;  // the first stage's receive, or the last stage's send
    bool head_receive_posted_ = false, head_sent_ = false;
    bool gather_issued_ = false, rows_issued_ = false, head_issued_ = false;
    double rows_squares_ = 0.0, head_squares_ = 0.0;
    Communicator& dp_;
    Backend& backend_;
};

}  // namespace ms
