// pipeline.h: one rank's part of the model under pipeline parallelism, and the executor of its schedule.
//
// With pp stages and v virtual stages the L layers form pp * v model chunks of L / (pp v) layers; this rank (stage
// s) holds local chunks c = 0..v-1, i.e. model chunks k = c * pp + s (engine/parallel/schedule.h). Chunk 0 of
// stage 0 holds the embeddings, the last chunk of stage pp-1 the final LayerNorm and the head with its own copy
// of the tied wte, whose gradient is summed over the embd group before the optimizer step. All local chunks share
// one flat parameter buffer and one flat gradient buffer (the optimizer's range map spans them).
//
// Point-to-point messages carry (micro_batch, T, C) activations or gradients in the model's dtype, straight from and
// into the chunks' activation slots: on a device backend with NCCL they never pass through host memory. Each run of
// consecutive sends and receives in the schedule is one batch (schedule.h: Megatron's send_forward_recv_backward
// and its siblings, so every receive is posted with the send before it), issued as one batch_send_recv and waited
// for before the next compute; check_in_order_p2p proves those batches free of deadlock with messages matched in
// issue order, as NCCL matches them. Each message also carries a tag naming its micro-batch, model-chunk edge and
// direction, which MPI matches by and NCCL ignores; both pair the same messages.
// pp = 1 runs the same code: a 1F1B schedule on one stage is forward, backward per micro-batch.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "comm/process_groups.h"
#include "engine/data/dataset.h"
#include "engine/model/gpt.h"
#include "engine/optim/grad_buckets.h"
#include "engine/optim/param_gather.h"
#include "engine/optim/sharded_grads.h"
#include "engine/parallel/context_split.h"
#include "engine/parallel/schedule.h"
#include "memory/memory_block.h"
#include "memory/staging_memory.h"

namespace ms {

class Trace;  // engine/train/trace.h

// The most micro-batches of each local chunk whose forward is done and backward is not, in a stage's action list:
// the activation slots PipelineModel gives each chunk.
std::vector<int> pipeline_activation_slots(const std::vector<Action>& stage_actions, int virtual_stages);

// The parameters of pipeline stage `stage` of pp (v virtual stages each, tp-sharded): its local chunks' tables back to
// back in one flat buffer, each chunk starting 16-aligned, offsets into that buffer. What PipelineModel holds.
struct StageParams {
    std::vector<ParamInfo> table;
    std::vector<GptPart> parts;  // (v) the local chunks' parts of the model
    std::vector<int64_t> bases;  // (v) where each local chunk's parameters start
    int64_t flat = 0;            // the flat length, before the data-parallel padding
};
StageParams stage_params(const GptShape& shape, int tp, int pp, int stage, int virtual_stages);

// The index in stage.table of the stage's copy of a tied token embedding, whose gradient the first and the last
// stage sum over the embd group once per step; -1 when there is none (pp 1, untied, a middle stage).
int tied_embedding_index(const GptShape& shape, const StageParams& stage, int pp);

// zero_stage 2's gradient memory of a stage (engine/optim/sharded_grads.h) over its padded_flat_size(stage.flat, dp)
// range: what PipelineModel allocates and `plan` counts.
ShardedGradLayout stage_sharded_grad_layout(const GptShape& shape, const StageParams& stage, int tp, int pp,
                                            bool sequence_parallel, DType act, const GptGraphOptions& graph, int dp,
                                            int64_t bucket_elems);

class PipelineModel {
  public:
    // The flat buffers are padded for the data-parallel optimizer (padded_flat_size over groups.dp_size). With an
    // arena, the flat parameters and gradients and every chunk's activation blocks are allocated from it, in this
    // order: parameters, gradients, the 16-bit weights (dtype bf16 / fp16 only), per local chunk its scratch block and
    // slot blocks (plan.h's StagePlan::allocations() lists the same sequence).
    // sharded_masters (distributed_optimizer.h shards_master_weights): no fp32 parameters are allocated; see
    // params(). The gradients are graph.grads (fp32, or dtype with mixed_precision.grad_reduce_in_fp32 false).
    // sharded_grad_bucket_elems > 0 (zero_stage 2, engine/optim/sharded_grads.h): no whole gradient buffer; the
    // gradients allocation is the bucket slots and the kept gradients, followed by this rank's dp shard of the
    // averaged gradients, and train_step() reduces each bucket over dp in every micro-batch's backward.
    PipelineModel(const GptShape& shape, Backend& backend, const ProcessGroups& groups, int micro_batch,
                  ScheduleKind kind, int num_microbatches, int virtual_stages, bool sequence_parallel = false,
                  Arena* arena = nullptr, DType dtype = DType::kF32, const GptGraphOptions& graph = {},
                  bool sharded_masters = false, int64_t sharded_grad_bucket_elems = 0);

    const std::vector<ParamInfo>& params_info() const { return table_; }
    int64_t flat_size() const { return flat_; }
    // The parameters and weights as the last optimizer step left them: with parallel.overlap_param_gather both
    // accessors first complete its gathers (the chunks' own programs wait for each bucket as they read it).
    // With sharded master weights the model holds no fp32 parameters: params() is then a place lent for them,
    // holding them only where a caller put them (init_weights(), a checkpoint load, the optimizer's gather_masters()
    // for a save) until the next train_step(): the fp32 gradient buffer, which that step zeroes, or with 16-bit
    // gradients (too small) staging memory outside the arena (memory/staging_memory.h), which that step releases.
    float* params() {
        settle_params();
        if (!sharded_masters_) return params_.as<float>();
        if (staging_.data() == nullptr) return grads_.as<float>();
        staging_lent_ = true;
        return static_cast<float*>(staging_.data());
    }
    // The gradients the optimizer reads, of grad_dtype(): the flat range (flat_size() padded elements), or with
    // zero_stage 2 this rank's dp shard of the averaged gradients.
    Tensor grads_tensor() { return sharded_ ? sharded_->shard() : Tensor(grads_.data(), grad_dtype_, {padded_}); }
    void* grads() { return grads_tensor().data; }
    DType grad_dtype() const { return grad_dtype_; }
    // zero_stage 2's gradients (null otherwise): the optimizer takes its squares before the reduction from it.
    const ShardedGrads* sharded_grads() const { return sharded_.get(); }
    DType dtype() const { return dtype_; }
    // The weights the chunks' ops read: params() in fp32, else the 16-bit copy of it (flat_size() elements).
    void* weights() {
        settle_params();
        return dtype_ == DType::kF32 ? static_cast<void*>(params_.as<float>()) : weights_.as<std::byte>();
    }
    // weights = params rounded to dtype() over the whole flat range (no-op in fp32): after anything writes params()
    // other than an optimizer that writes the copy itself (AdamWArgs::param_copy).
    void refresh_weights();
    void init_weights(uint64_t seed, float init_std = kGpt2InitStd);  // init_std: the config's model.init_method_std

    // Forward and backward of one step's micro-batches on this rank's data-parallel slice (samples from
    // first_sample + (mb * dp + dp_rank) * micro_batch), gradients accumulated into grads() (zeroed first) and the
    // tied embedding's gradient summed over embd. Returns the mean loss over the micro-batches (on every stage).
    // loss_scale multiplies the loss the backward starts from (fp16's loss scaling; 1 otherwise).
    float train_step(const Sampler& sampler, int64_t first_sample, int T, float loss_scale = 1.0f);
    // parallel.overlap_grad_reduce: the last micro-batch's backward of each chunk reports its final gradients to
    // `buckets`, which train_step() finishes after the per-step reductions (the gradients those complete are
    // deferred to then). Not owned; null: no overlap.
    void set_grad_buckets(GradBuckets* buckets);
    // parallel.overlap_param_gather: every chunk's forward and backward waits, before a step first reads parameters,
    // for the buckets of `gather` that hold them (graph::RunArgs::on_params_needed). Not owned; null: no overlap.
    void set_param_gather(ParamGather* gather);
    // logging.trace_dir: train_step() hands each forward, backward and point-to-point batch to `trace` (it records
    // them in the iterations it traces). Not owned; null: none.
    void set_trace(Trace* trace) { trace_ = trace; }
    // Mean loss of `micro_batches` micro-batches of this rank's slice, forward only (on every stage). stop, when
    // given, is called after every micro-batch on every rank (the trainer's agreement on a stop signal); once it
    // returns true the evaluation ends there and returns nullopt.
    std::optional<float> evaluate(const Sampler& sampler, int64_t micro_batches, int T,
                                  const std::function<bool()>& stop = {});
    // The single chunk when pp == 1 and v == 1 (sampling needs the whole model on one rank).
    Gpt* whole_model() { return chunks_.size() == 1 && groups_.pp_size == 1 ? chunks_[0].get() : nullptr; }
    // Activation slots per local chunk (micro-batches in flight): the schedule's peak.
    const std::vector<int>& slots_per_chunk() const { return slots_; }

  private:
    int model_chunk(int local_chunk) const { return local_chunk * groups_.pp_size + groups_.pp_rank; }
    int tag(int microbatch, int edge, int direction) const;
    // tokens_ and targets_ of micro-batch `microbatch` of the step from first_sample: this replica's samples of T
    // tokens, of which this context rank's rows (context_split.h)
    void fill(const Sampler& sampler, int64_t first_sample, int64_t microbatch, int T);
    // Adds sending or receiving n elements of dtype() at data to the batch being gathered; run_batch() issues it and
    // waits, after checking that no receive overlaps another buffer of the batch.
    void add_p2p(P2POp::Kind kind, const void* data, size_t n, int peer, int tag);
    void run_batch();
    // The buckets reduce the tied embedding's lookup and output-layer gradients apart (GradBuckets::tie).
    bool reduce_tied_apart() const { return buckets_ != nullptr && tied_grads_apart_; }
    // The tied embedding lies on this stage and on the other end of the pipeline (the embedding group).
    bool tied_across_stages() const { return wte_index_ >= 0 && groups_.embd && groups_.embd->size() > 1; }

    GptShape shape_;
    Backend& backend_;
    const ProcessGroups& groups_;
    int micro_batch_, num_microbatches_, virtual_stages_;
    std::vector<std::vector<Action>> schedule_;  // every stage's list (this rank runs schedule_[pp_rank])
    std::vector<std::vector<Action>> forward_;   // one micro-batch's forward (make_forward_schedule): evaluation
    std::vector<std::unique_ptr<Gpt>> chunks_;   // local chunks 0..v-1
    std::vector<int> slots_;                     // activation slots per local chunk
    std::vector<ParamInfo> table_;               // every local chunk's parameters, offsets in the shared buffers
    std::vector<int64_t> bases_;                 // per local chunk: where its parameters start in the flat buffers
    void settle_params() {
        if (gather_ != nullptr) gather_->finish();
    }

    Trace* trace_ = nullptr;
    GradBuckets* buckets_ = nullptr;
    std::vector<graph::GradsFinalFn> report_final_;    // per local chunk, to buckets_ or sharded_ with its base
    std::unique_ptr<ShardedGrads> sharded_;            // zero_stage 2
    std::vector<graph::GradsFinalFn> report_writing_;  // per local chunk, to sharded_ with its base
    graph::GradPlacement grad_placement_;              // where the stage's gradients live
    ParamGather* gather_ = nullptr;
    std::vector<graph::ParamsNeededFn> need_params_;  // per local chunk, to gather_ with its base
    int64_t flat_ = 0;
    int wte_index_ = -1;  // in table_, when this rank holds a copy of a tied token embedding and pp > 1
    DType dtype_ = DType::kF32, grad_dtype_ = DType::kF32;
    bool sharded_masters_ = false;
    bool tied_grads_apart_ = false;  // GptGraphOptions::tied_grads_apart, on a tied model
    int64_t padded_ = 0;             // the flat buffers' length: flat_ padded for the data-parallel optimizer
    MemoryBlock params_, grads_;     // (padded) flat fp32 and grad_dtype_; params_ empty with sharded masters, grads_
                                     // zero_stage 2's slots and kept gradients
    MemoryBlock grad_shard_;         // zero_stage 2: this rank's dp shard of the averaged gradients
    StagingMemory staging_;          // (padded) fp32, with sharded masters and gradients too small to lend: params()
    bool staging_lent_ = false;      // params() handed staging_ out since the last train_step()
    MemoryBlock weights_;            // (padded) flat dtype_, when it is not fp32
    std::vector<int32_t> tokens_, targets_;
    ContextSplit context_;                                 // this rank's rows of a sequence
    std::vector<int32_t> sample_tokens_, sample_targets_;  // whole samples, cut into tokens_ / targets_ (cp > 1)
    // train_step()'s bookkeeping, sized once here so that a step allocates nothing
    std::vector<std::vector<int>> slot_of_;     // (v, micro-batches) slot of a chunk's micro-batch, or -1
    std::vector<std::vector<int>> free_slots_;  // (v) free slots of each chunk
    std::vector<P2POp> batch_;  // the point-to-point batch being gathered (a few ops), its capacity reserved once
};

}  // namespace ms
