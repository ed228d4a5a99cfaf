#include "engine/train/pipeline.h"

#include <algorithm>
#include <limits>
#include <span>

#include "engine/core/timer.h"
#include "engine/model/gpt_graph.h"
#include "engine/optim/distributed_optimizer.h"
#include "engine/train/trace.h"

namespace ms {
namespace {

constexpr int64_t kChunkAlign = 16;

}  // namespace

std::vector<int> pipeline_activation_slots(const std::vector<Action>& actions, int chunks) {
    std::vector<int> live(static_cast<size_t>(chunks), 0), peak(static_cast<size_t>(chunks), 1);
    for (const Action& a : actions) {
        if (a.kind == Action::Kind::kForward) peak[a.chunk] = std::max(peak[a.chunk], ++live[a.chunk]);
        if (a.kind == Action::Kind::kBackward) --live[a.chunk];
    }
    return peak;
}

StageParams stage_params(const GptShape& shape, int tp, int pp, int stage, int virtual_stages) {
    const int v = virtual_stages, K = pp * v;
    MS_CHECK(shape.L % K == 0, "{} layers do not split into {} pipeline chunks", shape.L, K);
    const int Lc = shape.L / K;
    StageParams st;
    for (int c = 0; c < v; ++c) {
        const int k = c * pp + stage;  // the model chunk of local chunk c (schedule.h)
        const GptPart part{k * Lc, Lc, k == 0, k == K - 1};
        st.bases.push_back(st.flat);
        for (ParamInfo p : gpt_param_table(shape, tp, part)) {
            p.offset += st.flat;
            st.table.push_back(std::move(p));
        }
        st.flat = (st.table.back().offset + st.table.back().numel + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
        st.parts.push_back(part);
    }
    return st;
}

int tied_embedding_index(const GptShape& shape, const StageParams& stage, int pp) {
    if (pp == 1 || shape.untied) return -1;
    for (size_t i = 0; i < stage.table.size(); ++i)
        if (stage.table[i].name == embedding_weight_name(shape)) return static_cast<int>(i);
    return -1;
}

ShardedGradLayout stage_sharded_grad_layout(const GptShape& shape, const StageParams& stage, int tp, int pp,
                                            bool sequence_parallel, DType act, const GptGraphOptions& graph, int dp,
                                            int64_t bucket_elems) {
    std::vector<ChunkGradWrites> writes;
    for (size_t c = 0; c < stage.parts.size(); ++c)
        writes.push_back({stage.bases[c], gpt_grad_writes(shape, stage.parts[c], tp, sequence_parallel, act, graph)});
    std::vector<graph::GradRange> per_step;
    if (const int wte = tied_embedding_index(shape, stage, pp); wte >= 0) {
        const ParamInfo& p = stage.table[static_cast<size_t>(wte)];
        per_step.push_back({p.offset, p.offset + p.numel});
    }
    return sharded_grad_layout(writes, per_step, padded_flat_size(stage.flat, dp), bucket_elems, dp);
}

PipelineModel::PipelineModel(const GptShape& shape, Backend& backend, const ProcessGroups& groups, int micro_batch,
                             ScheduleKind kind, int num_microbatches, int virtual_stages, bool sequence_parallel,
                             Arena* arena, DType dtype, const GptGraphOptions& graph, bool sharded_masters,
                             int64_t sharded_grad_bucket_elems)
    : shape_(shape),
      backend_(backend),
      groups_(groups),
      micro_batch_(micro_batch),
      num_microbatches_(num_microbatches),
      virtual_stages_(virtual_stages),
      dtype_(dtype),
      grad_dtype_(graph.grads),
      sharded_masters_(sharded_masters),
      tied_grads_apart_(graph.tied_grads_apart && !shape.untied) {
    MS_CHECK(!sharded_masters || dtype != DType::kF32, "sharded master weights need 16-bit weights");
    const int pp = groups.pp_size, v = virtual_stages;
    schedule_ = make_schedule(kind, pp, num_microbatches, v);
    forward_ = make_forward_schedule(pp, v);
    slots_ = pipeline_activation_slots(schedule_[static_cast<size_t>(groups.pp_rank)], v);

    // one flat layout over the local chunks
    StageParams stage = stage_params(shape, groups.tp_size, pp, groups.pp_rank, v);
    table_ = stage.table;
    flat_ = stage.flat;
    const std::vector<GptPart>& parts = stage.parts;
    const std::vector<int64_t>& bases = stage.bases;
    const int64_t capacity = padded_flat_size(flat_, groups.dp_size);
    padded_ = capacity;
    wte_index_ = tied_embedding_index(shape, stage, pp);
    const size_t fp32_bytes = static_cast<size_t>(capacity) * sizeof(float);
    const bool shard_grads = sharded_grad_bucket_elems > 0;
    if (!sharded_masters) {
        params_ = MemoryBlock(fp32_bytes, arena, MemCategory::kParameter, "params");
    } else if (grad_dtype_ != DType::kF32 || shard_grads) {
        staging_ = StagingMemory(fp32_bytes, backend.make_arena_memory(fp32_bytes));
    }
    const size_t gs = dtype_size(grad_dtype_);
    if (shard_grads) {
        ShardedGradLayout layout = stage_sharded_grad_layout(shape, stage, groups.tp_size, pp, sequence_parallel, dtype,
                                                             graph, groups.dp_size, sharded_grad_bucket_elems);
        grads_ = MemoryBlock(static_cast<size_t>(layout.buffer_elems()) * gs, arena, MemCategory::kGradient,
                             fmt::format("grads {} (bucket slots, kept)", dtype_name(grad_dtype_)));
        grad_shard_ = MemoryBlock(static_cast<size_t>(layout.shard_elems) * gs, arena, MemCategory::kGradient,
                                  fmt::format("grads {} (dp shard)", dtype_name(grad_dtype_)));
        sharded_ = std::make_unique<ShardedGrads>(std::move(layout), grads_.data(), grad_shard_.data(), grad_dtype_,
                                                  *groups.dp, backend);
        grad_placement_ = sharded_->placement();
    } else {
        grads_ = MemoryBlock(static_cast<size_t>(capacity) * gs, arena, MemCategory::kGradient,
                             fmt::format("grads {}", dtype_name(grad_dtype_)));
        grad_placement_ = graph::GradPlacement(grads_.data(), grad_dtype_, capacity);
    }
    const size_t es = dtype_size(dtype);
    if (dtype != DType::kF32) {
        weights_ = MemoryBlock(static_cast<size_t>(capacity) * es, arena, MemCategory::kParameter,
                               fmt::format("weights {}", dtype_name(dtype)));
    }
    for (int c = 0; c < v; ++c) {
        Gpt::Options o;
        o.max_batch = micro_batch;
        o.part = parts[static_cast<size_t>(c)];
        o.num_slots = slots_[static_cast<size_t>(c)];
        o.params = params() + bases[static_cast<size_t>(c)];
        o.grads = grad_placement_.from(bases[static_cast<size_t>(c)]);
        o.sequence_parallel = sequence_parallel;
        o.arena = arena;
        o.dtype = dtype;
        o.graph = graph;
        o.weights = static_cast<std::byte*>(weights()) + static_cast<size_t>(bases[static_cast<size_t>(c)]) * es;
        o.cp = groups.cp.get();
        chunks_.push_back(std::make_unique<Gpt>(shape, backend, *groups.tp, o));
    }
    bases_ = bases;
    if (sharded_) {  // every micro-batch's backward reports to it
        for (size_t c = 0; c < chunks_.size(); ++c) {
            const int64_t base = bases_[c];
            ShardedGrads* sg = sharded_.get();
            report_final_.push_back([sg, base](std::span<const graph::GradRange> r) { sg->final(r, base); });
            report_writing_.push_back([sg, base](std::span<const graph::GradRange> r) { sg->writing(r, base); });
        }
    }
    context_ = ContextSplit{groups.cp_size, groups.cp_rank};
    tokens_.resize(static_cast<size_t>(micro_batch * context_.local(shape.seq())));
    targets_.resize(tokens_.size());
    if (context_.cp > 1) {
        sample_tokens_.resize(static_cast<size_t>(micro_batch) * shape.seq());
        sample_targets_.resize(sample_tokens_.size());
    }
    slot_of_.assign(static_cast<size_t>(v), std::vector<int>(static_cast<size_t>(num_microbatches), -1));
    free_slots_.resize(static_cast<size_t>(v));
    for (int c = 0; c < v; ++c) free_slots_[static_cast<size_t>(c)].reserve(static_cast<size_t>(slots_[c]));

    batch_.reserve(8);
}

void PipelineModel::init_weights(uint64_t seed, float init_std) {
    for (auto& c : chunks_) c->init_weights(seed, init_std);
}

void PipelineModel::refresh_weights() {
    if (dtype_ == DType::kF32) return;
    backend_.cast({Tensor::f32(params(), {flat_}), Tensor(weights(), dtype_, {flat_})});
}

int PipelineModel::tag(int microbatch, int edge, int direction) const {
    return ((microbatch * groups_.pp_size * virtual_stages_) + edge) * 2 + direction;
}

void PipelineModel::fill(const Sampler& sampler, int64_t first_sample, int64_t microbatch, int T) {
    const int64_t first = first_sample + (microbatch * groups_.replicas() + groups_.replica()) * micro_batch_;
    if (context_.cp == 1) {
        sampler.fill(first, micro_batch_, tokens_.data(), targets_.data());
        return;
    }
    sampler.fill(first, micro_batch_, sample_tokens_.data(), sample_targets_.data());
    context_.rows(sample_tokens_.data(), tokens_.data(), micro_batch_, T, 1);
    context_.rows(sample_targets_.data(), targets_.data(), micro_batch_, T, 1);
}

void PipelineModel::add_p2p(P2POp::Kind kind, const void* data, size_t n, int peer, int tag) {
    batch_.push_back({kind, peer, const_cast<void*>(data), n, dtype_, tag});
}

void PipelineModel::run_batch() {
    // A receive shares its batch with other transfers in flight, and may land in a slot whose gradient is being
    // sent (a send-grad frees its slot for the receive after it): the buffers must be disjoint.
    const size_t es = dtype_size(dtype_);
    for (const P2POp& r : batch_) {
        if (r.kind != P2POp::Kind::kRecv) continue;
        const auto* r0 = static_cast<const std::byte*>(r.data);
        for (const P2POp& o : batch_) {
            const auto* o0 = static_cast<const std::byte*>(o.data);
            MS_CHECK(&o == &r || r0 + r.count * es <= o0 || o0 + o.count * es <= r0,
                     "pipeline: a receive from stage {} overlaps another transfer of its batch", r.peer);
        }
    }
    groups_.pp->batch_send_recv(std::span<const P2POp>(batch_), Priority::kHigh).wait();
    batch_.clear();
}

void PipelineModel::set_grad_buckets(GradBuckets* buckets) {
    MS_CHECK(!sharded_ || buckets == nullptr, "zero_stage 2 reduces its own buckets: no GradBuckets beside them");
    buckets_ = buckets;
    report_final_.clear();
    if (buckets == nullptr) return;
    for (size_t c = 0; c < chunks_.size(); ++c) {
        const int64_t base = bases_[c];
        const Gpt& chunk = *chunks_[c];
        std::vector<graph::GradRange> per_step = chunk.gradients_finished_per_step();
        for (graph::GradRange& r : per_step) r = {r.begin + base, r.end + base};
        if (reduce_tied_apart() && (chunk.part().embedding || chunk.part().head)) {
            // the lookup's gradient and the head's are reduced apart, each as soon as it is final
            const std::vector<ParamInfo>& params = chunk.params_info();
            const auto wte = std::find_if(params.begin(), params.end(),
                                          [&](const ParamInfo& p) { return p.name == embedding_weight_name(shape_); });
            MS_CHECK(wte != params.end(), "pipeline: chunk {} has no '{}'", c, embedding_weight_name(shape_));
            const graph::GradRange range{base + wte->offset, base + wte->offset + wte->numel};
            std::erase(per_step, range);
            const int64_t rows = wte->numel / shape_.C;
            GradBuckets::TiedEmbedding tied{.range = range,
                                            .row_elems = shape_.C,
                                            .lookup = chunk.part().embedding,
                                            .first_row = groups_.tp_rank * rows,
                                            .max_tokens = static_cast<int64_t>(tokens_.size()) * num_microbatches_,
                                            .head = chunk.head_gradients_apart()};
            if (tied_across_stages()) {  // the first and the last stage add each other's average (grad_buckets.h)
                const StageParams first = stage_params(shape_, groups_.tp_size, groups_.pp_size, 0, virtual_stages_);
                const ParamInfo& p =
                    first.table[static_cast<size_t>(tied_embedding_index(shape_, first, groups_.pp_size))];
                tied.stages = groups_.embd.get();
                tied.first_stage_range = {p.offset, p.offset + p.numel};
                tied.first_stage_padded = padded_flat_size(first.flat, groups_.dp_size);
            }
            buckets->tie(tied);
        }
        buckets->defer(per_step);
        report_final_.push_back([buckets, base](std::span<const graph::GradRange> r) { buckets->final(r, base); });
    }
    if (!reduce_tied_apart() && tied_across_stages()) {
        // summed over embd in train_step before the buckets' reductions
        const ParamInfo& p = table_[static_cast<size_t>(wte_index_)];
        const graph::GradRange wte{p.offset, p.offset + p.numel};
        buckets->defer(std::span<const graph::GradRange>(&wte, 1));
    }
}

void PipelineModel::set_param_gather(ParamGather* gather) {
    gather_ = gather;
    need_params_.clear();
    need_params_.reserve(chunks_.size());  // the chunks keep pointers into it
    for (size_t c = 0; c < chunks_.size(); ++c) {
        if (gather != nullptr) {
            const int64_t base = bases_[c];
            need_params_.push_back([gather, base](std::span<const graph::GradRange> r) { gather->need(r, base); });
        }
        chunks_[c]->set_params_needed(gather != nullptr ? &need_params_.back() : nullptr);
    }
}

float PipelineModel::train_step(const Sampler& sampler, int64_t first_sample, int T, float loss_scale_in) {
    if (buckets_ != nullptr) buckets_->begin_step();
    if (staging_lent_) {  // what init, a load or a save put there has been taken
        staging_.release();
        staging_lent_ = false;
    }
    if (sharded_)
        sharded_->begin_step();  // the slots are zeroed as each bucket is first written
    else
        backend_.zero(Tensor(grads_.data(), grad_dtype_, {flat_}));  // on the device for a device backend
    const int v = virtual_stages_;
    const int Tl = static_cast<int>(context_.local(T));  // this rank's rows of each sequence
    const size_t act = static_cast<size_t>(chunks_[0]->activation_elems(micro_batch_, Tl));
    Communicator& pp = *groups_.pp;
    auto& slot_of = slot_of_;  // slot of (chunk, micro-batch), -1 when not placed
    auto& free_slots = free_slots_;
    for (int c = 0; c < v; ++c) {  // every slot free, every micro-batch unplaced (as the last step left them)
        std::fill(slot_of[c].begin(), slot_of[c].end(), -1);
        free_slots[c].clear();
        for (int s = slots_[c] - 1; s >= 0; --s) free_slots[c].push_back(s);
    }
    auto acquire = [&](int c, int mb) {
        MS_CHECK(!free_slots[c].empty(), "pipeline: no free activation slot for chunk {} micro-batch {}", c, mb);
        const int s = free_slots[c].back();
        free_slots[c].pop_back();
        slot_of[c][mb] = s;
        return s;
    };
    float loss = 0;
    const float loss_scale = loss_scale_in / static_cast<float>(num_microbatches_);
    const std::vector<Action>& actions = schedule_[static_cast<size_t>(groups_.pp_rank)];
    for (size_t i = 0; i < actions.size(); ++i) {
        const Action& a = actions[i];
        const int c = a.chunk, mb = a.microbatch, k = model_chunk(c);
        Gpt& chunk = *chunks_[static_cast<size_t>(c)];
        const double t0 = trace_ != nullptr ? now_seconds() : 0.0;
        switch (a.kind) {
            case Action::Kind::kRecvActivation: {
                const int s = acquire(c, mb);
                add_p2p(P2POp::Kind::kRecv, chunk.input(s), act, a.peer_stage, tag(mb, k - 1, 0));
                break;
            }
            case Action::Kind::kForward: {
                const int s = slot_of[c][mb] >= 0 ? slot_of[c][mb] : acquire(c, mb);
                const bool needs_data = chunk.part().embedding || chunk.part().head;
                if (needs_data) fill(sampler, first_sample, mb, T);
                if (reduce_tied_apart() && chunk.part().embedding)
                    buckets_->look_up(std::span<const int32_t>(tokens_.data(), static_cast<size_t>(micro_batch_) * Tl));
                const float l = chunk.forward(tokens_.data(), targets_.data(), micro_batch_, Tl, s, loss_scale);
                if (chunk.part().head) loss += l;
                break;
            }
            case Action::Kind::kSendActivation: {
                add_p2p(P2POp::Kind::kSend, chunk.output(slot_of[c][mb]), act, a.peer_stage, tag(mb, k, 0));
                break;
            }
            case Action::Kind::kRecvGrad: {
                const int s = slot_of[c][mb];
                add_p2p(P2POp::Kind::kRecv, chunk.grad_output(s), act, a.peer_stage, tag(mb, k, 1));
                break;
            }
            case Action::Kind::kBackward: {
                const int s = slot_of[c][mb];
                const bool report = sharded_ || (buckets_ != nullptr && mb == num_microbatches_ - 1);
                chunk.backward(s, report ? &report_final_[static_cast<size_t>(c)] : nullptr,
                               sharded_ ? &report_writing_[static_cast<size_t>(c)] : nullptr);
                if (chunk.part().embedding) {  // nothing to send: the slot is free now
                    free_slots[c].push_back(s);
                    slot_of[c][mb] = -1;
                }
                break;
            }
            case Action::Kind::kSendGrad: {
                const int s = slot_of[c][mb];
                add_p2p(P2POp::Kind::kSend, chunk.grad_input(s), act, a.peer_stage, tag(mb, k - 1, 1));
                // Free for a receive later in this batch: only the gradient is still read, and run_batch() checks
                // that the receive's buffer is another.
                free_slots[c].push_back(s);
                slot_of[c][mb] = -1;
                break;
            }
        }
        if (trace_ != nullptr && !is_p2p(a.kind)) trace_->compute(a, t0, now_seconds());
        if (ends_p2p_batch(actions, i)) {
            const double issued = trace_ != nullptr ? now_seconds() : 0.0;
            run_batch();
            if (trace_ != nullptr) trace_->p2p_batch(actions, i, issued, now_seconds());
        }
    }
    // The loss, which only the last stage has, to every stage: here, before the gradients' reductions, the last stage
    // waits for the first stage's last backward -- the schedule's cool-down, counted with the pipeline's bubble --
    // rather than in the tied embedding's exchange between the two.
    float mean = loss / static_cast<float>(num_microbatches_);
    pp.all_reduce(std::span<float>(&mean, 1), ReduceOp::kSum).wait();
    for (auto& c : chunks_) c->finish_gradients(!reduce_tied_apart());
    // the tied embedding: first and last stage each hold wte; their gradients are summed before the data-parallel
    // average, unless the buckets reduce the lookup's and the head's apart and the stages add the averages
    // (grad_buckets.h)
    if (tied_across_stages() && !reduce_tied_apart()) {
        const ParamInfo& p = table_[static_cast<size_t>(wte_index_)];
        groups_.embd
            ->all_reduce(grad_placement_.at(p.offset, p.numel), static_cast<size_t>(p.numel), grad_dtype_,
                         ReduceOp::kSum)
            .wait();
    }
    if (buckets_ != nullptr) buckets_->finish();
    if (sharded_) sharded_->finish();
    return mean;
}

std::optional<float> PipelineModel::evaluate(const Sampler& sampler, int64_t micro_batches, int T,
                                             const std::function<bool()>& stop) {
    const int Tl = static_cast<int>(context_.local(T));
    const size_t act = static_cast<size_t>(chunks_[0]->activation_elems(micro_batch_, Tl));
    Communicator& pp = *groups_.pp;
    const std::vector<Action>& actions = forward_[static_cast<size_t>(groups_.pp_rank)];
    float total = 0;
    for (int64_t m = 0; m < micro_batches; ++m) {
        fill(sampler, 0, m, T);
        for (size_t i = 0; i < actions.size(); ++i) {  // every chunk in slot 0, its messages tagged micro-batch 0
            const Action& a = actions[i];
            const int k = model_chunk(a.chunk);
            Gpt& chunk = *chunks_[static_cast<size_t>(a.chunk)];
            if (a.kind == Action::Kind::kRecvActivation) {
                add_p2p(P2POp::Kind::kRecv, chunk.input(0), act, a.peer_stage, tag(0, k - 1, 0));
            } else if (a.kind == Action::Kind::kSendActivation) {
                add_p2p(P2POp::Kind::kSend, chunk.output(0), act, a.peer_stage, tag(0, k, 0));
            } else {
                const float l =
                    chunk.forward(tokens_.data(), targets_.data(), micro_batch_, Tl, 0, 0.0f);  // no backward
                if (chunk.part().head) total += l;
            }
            if (ends_p2p_batch(actions, i)) run_batch();
        }
        if (stop && stop()) return std::nullopt;
    }
    total /= static_cast<float>(micro_batches);
    pp.all_reduce(std::span<float>(&total, 1), ReduceOp::kSum).wait();
    return total;
}

}  // namespace ms
