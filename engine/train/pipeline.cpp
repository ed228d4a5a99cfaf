#include "engine/train/pipeline.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <span>

#include "engine/optim/distributed_optimizer.h"

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

int pipeline_send_buffers(const std::vector<std::vector<Action>>& schedule, int stage, int virtual_stages) {
    using Kind = Action::Kind;
    const int pp = static_cast<int>(schedule.size());
    auto is_send = [](Kind k) { return k == Kind::kSendActivation || k == Kind::kSendGrad; };
    auto is_recv = [](Kind k) { return k == Kind::kRecvActivation || k == Kind::kRecvGrad; };
    auto direction = [](Kind k) { return k == Kind::kSendGrad || k == Kind::kRecvGrad ? 1 : 0; };
    // Messages between two stages match in order per direction (schedule.h): the n-th send from s to t in a
    // direction is the n-th receive at t from s in it. Channel (from, to, direction) -> index.
    auto channel = [pp](int from, int to, int dir) { return (static_cast<size_t>(from) * pp + to) * 2 + dir; };
    std::vector<std::vector<int>> recv_at(static_cast<size_t>(pp) * pp * 2);  // channel -> receive positions
    for (int t = 0; t < pp; ++t) {
        const auto& list = schedule[static_cast<size_t>(t)];
        for (size_t j = 0; j < list.size(); ++j)
            if (is_recv(list[j].kind))
                recv_at[channel(list[j].peer_stage, t, direction(list[j].kind))].push_back(static_cast<int>(j));
    }
    // Run the lists (sends never block, receives wait for their send) with a vector clock per stage:
    // clock[s][t] = how many of stage t's actions stage s knows to have happened.
    std::vector<std::vector<int>> clock(static_cast<size_t>(pp), std::vector<int>(static_cast<size_t>(pp), 0));
    std::vector<std::vector<std::vector<int>>> messages(recv_at.size());  // channel -> the senders' clocks
    std::vector<size_t> received(recv_at.size(), 0), sent(recv_at.size(), 0), next(static_cast<size_t>(pp), 0);
    struct Pending {
        int peer, recv_position;
    };
    std::vector<Pending> mine;  // `stage`'s sends so far: where their receives are
    int most = 0;
    for (bool progress = true; progress;) {
        progress = false;
        for (int s = 0; s < pp; ++s) {
            const auto& list = schedule[static_cast<size_t>(s)];
            auto& vc = clock[static_cast<size_t>(s)];
            for (size_t& i = next[static_cast<size_t>(s)]; i < list.size(); ++i, progress = true) {
                const Action& a = list[i];
                if (is_recv(a.kind)) {
                    const size_t ch = channel(a.peer_stage, s, direction(a.kind));
                    if (received[ch] == messages[ch].size()) break;  // its send has not been issued yet
                    const std::vector<int>& m = messages[ch][received[ch]++];
                    for (int t = 0; t < pp; ++t) vc[t] = std::max(vc[t], m[t]);
                }
                ++vc[s];
                if (!is_send(a.kind)) continue;
                const size_t ch = channel(s, a.peer_stage, direction(a.kind));
                messages[ch].push_back(vc);
                if (s != stage) continue;
                mine.push_back({a.peer_stage, recv_at[ch].at(sent[ch]++)});
                int in_flight = 0;
                for (const Pending& p : mine) in_flight += vc[p.peer] <= p.recv_position;
                most = std::max(most, in_flight);
            }
        }
    }
    for (int s = 0; s < pp; ++s) {
        MS_CHECK(next[static_cast<size_t>(s)] == schedule[static_cast<size_t>(s)].size(),
                 "pipeline schedule: stage {} waits forever at action {}", s, next[static_cast<size_t>(s)]);
    }
    int eval = 0;  // evaluate(): one send per local chunk but the model's last, all waited for per micro-batch
    for (int c = 0; c < virtual_stages; ++c) eval += c * pp + stage < pp * virtual_stages - 1;
    return std::max(most, eval);
}

PipelineModel::PipelineModel(const GptShape& shape, Backend& backend, const ProcessGroups& groups, int micro_batch,
                             ScheduleKind kind, int num_microbatches, int virtual_stages, bool sequence_parallel,
                             Arena* arena, DType dtype, const GptGraphOptions& graph)
    : shape_(shape),
      backend_(backend),
      groups_(groups),
      micro_batch_(micro_batch),
      num_microbatches_(num_microbatches),
      virtual_stages_(virtual_stages),
      dtype_(dtype) {
    const int pp = groups.pp_size, v = virtual_stages, K = pp * v;
    MS_CHECK(shape.L % K == 0, "{} layers do not split into {} pipeline chunks", shape.L, K);
    schedule_ = make_schedule(kind, pp, num_microbatches, v);
    slots_ = pipeline_activation_slots(schedule_[static_cast<size_t>(groups.pp_rank)], v);

    // one flat layout over the local chunks
    const int Lc = shape.L / K;
    std::vector<GptPart> parts;
    std::vector<int64_t> bases;
    for (int c = 0; c < v; ++c) {
        const int k = model_chunk(c);
        GptPart part{k * Lc, Lc, k == 0, k == K - 1};
        bases.push_back(flat_);
        for (ParamInfo p : gpt_param_table(shape, groups.tp_size, part)) {
            p.offset += flat_;
            table_.push_back(std::move(p));
        }
        flat_ = (table_.back().offset + table_.back().numel + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
        parts.push_back(part);
    }
    const int64_t capacity = padded_flat_size(flat_, groups.dp_size);
    params_ = MemoryBlock(static_cast<size_t>(capacity) * sizeof(float), arena, MemCategory::kParameter, "params");
    grads_ = MemoryBlock(static_cast<size_t>(capacity) * sizeof(float), arena, MemCategory::kGradient, "grads");
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
        o.grads = grads() + bases[static_cast<size_t>(c)];
        o.sequence_parallel = sequence_parallel;
        o.arena = arena;
        o.dtype = dtype;
        o.graph = graph;
        o.weights = static_cast<std::byte*>(weights()) + static_cast<size_t>(bases[static_cast<size_t>(c)]) * es;
        chunks_.push_back(std::make_unique<Gpt>(shape, backend, *groups.tp, o));
    }
    if (pp > 1) {
        for (size_t i = 0; i < table_.size(); ++i)
            if (table_[i].name == "wte.weight") wte_index_ = static_cast<int>(i);
    }
    bases_ = bases;
    tokens_.resize(static_cast<size_t>(micro_batch) * shape.seq());
    targets_.resize(static_cast<size_t>(micro_batch) * shape.seq());
    slot_of_.assign(static_cast<size_t>(v), std::vector<int>(static_cast<size_t>(num_microbatches), -1));
    free_slots_.resize(static_cast<size_t>(v));
    for (int c = 0; c < v; ++c) free_slots_[static_cast<size_t>(c)].reserve(static_cast<size_t>(slots_[c]));

    const int sends = pipeline_send_buffers(schedule_, groups.pp_rank, v);
    send_elems_ = static_cast<size_t>((chunks_[0]->activation_elems(micro_batch, shape.seq()) + kChunkAlign - 1) /
                                      kChunkAlign * kChunkAlign);
    send_block_ =
        MemoryBlock(static_cast<size_t>(sends) * send_elems_ * es, arena, MemCategory::kComm, "pipeline send buffers");
    for (int i = 0; i < sends; ++i)
        send_pool_.push_back({send_block_.as<std::byte>() + i * send_elems_ * es, Handle()});
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

void PipelineModel::fill(const Sampler& sampler, int64_t first_sample, int microbatch, int T) {
    const int64_t first =
        first_sample + (static_cast<int64_t>(microbatch) * groups_.dp_size + groups_.dp_rank) * micro_batch_;
    sampler.fill(first, micro_batch_, tokens_.data(), targets_.data());
    (void)T;
}

void PipelineModel::receive(void* data, size_t n, int peer, int tag) {
    const P2POp op{P2POp::Kind::kRecv, peer, data, n, dtype_, tag};
    groups_.pp->batch_send_recv(std::span<const P2POp>(&op, 1), Priority::kHigh).wait();
}

void PipelineModel::post_send(const void* data, size_t n, int peer, int tag) {
    MS_CHECK(n <= send_elems_, "pipeline: a send of {} elements exceeds the send buffers' {}", n, send_elems_);
    PendingSend* slot = nullptr;
    for (PendingSend& p : send_pool_) {
        if (p.handle.test()) {
            slot = &p;
            break;
        }
    }
    // All busy: one of them has a completed receive (pipeline_send_buffers()), so polling frees it; waiting on a
    // particular one could wait on a peer that waits on us.
    MS_CHECK(!send_pool_.empty(), "pipeline: a send on a stage planned to send nothing");
    for (size_t i = 0; !slot; i = (i + 1) % send_pool_.size())
        if (send_pool_[i].handle.test()) slot = &send_pool_[i];
    backend_.synchronize();  // the host reads `data`, which kernels wrote (asynchronous backend)
    std::memcpy(slot->buffer, data, n * dtype_size(dtype_));
    const P2POp op{P2POp::Kind::kSend, peer, slot->buffer, n, dtype_, tag};
    slot->handle = groups_.pp->batch_send_recv(std::span<const P2POp>(&op, 1), Priority::kHigh);
}

void PipelineModel::wait_sends() {
    for (PendingSend& p : send_pool_) p.handle.wait();
}

void PipelineModel::set_grad_buckets(GradBuckets* buckets) {
    buckets_ = buckets;
    report_final_.clear();
    if (buckets == nullptr) return;
    for (size_t c = 0; c < chunks_.size(); ++c) {
        const int64_t base = bases_[c];
        std::vector<graph::GradRange> per_step = chunks_[c]->gradients_finished_per_step();
        for (graph::GradRange& r : per_step) r = {r.begin + base, r.end + base};
        buckets->defer(per_step);
        report_final_.push_back([buckets, base](std::span<const graph::GradRange> r) { buckets->final(r, base); });
    }
    if (wte_index_ >= 0 && groups_.embd && groups_.embd->size() > 1) {  // summed over embd in train_step
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
    backend_.zero(Tensor::f32(grads(), {flat_}));  // on the device for a device backend
    const int v = virtual_stages_;
    const size_t act = static_cast<size_t>(chunks_[0]->activation_elems(micro_batch_, T));
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
    for (const Action& a : schedule_[static_cast<size_t>(groups_.pp_rank)]) {
        const int c = a.chunk, mb = a.microbatch, k = model_chunk(c);
        Gpt& chunk = *chunks_[static_cast<size_t>(c)];
        switch (a.kind) {
            case Action::Kind::kRecvActivation: {
                const int s = acquire(c, mb);
                receive(chunk.input(s), act, a.peer_stage, tag(mb, k - 1, 0));
                break;
            }
            case Action::Kind::kForward: {
                const int s = slot_of[c][mb] >= 0 ? slot_of[c][mb] : acquire(c, mb);
                const bool needs_data = chunk.part().embedding || chunk.part().head;
                if (needs_data) fill(sampler, first_sample, mb, T);
                const float l = chunk.forward(tokens_.data(), targets_.data(), micro_batch_, T, s, loss_scale);
                if (chunk.part().head) loss += l;
                break;
            }
            case Action::Kind::kSendActivation: {
                post_send(chunk.output(slot_of[c][mb]), act, a.peer_stage, tag(mb, k, 0));
                break;
            }
            case Action::Kind::kRecvGrad: {
                const int s = slot_of[c][mb];
                receive(chunk.grad_output(s), act, a.peer_stage, tag(mb, k, 1));
                break;
            }
            case Action::Kind::kBackward: {
                const int s = slot_of[c][mb];
                const bool last = buckets_ != nullptr && mb == num_microbatches_ - 1;
                chunk.backward(s, last ? &report_final_[static_cast<size_t>(c)] : nullptr);
                if (chunk.part().embedding) {  // nothing to send: the slot is free now
                    free_slots[c].push_back(s);
                    slot_of[c][mb] = -1;
                }
                break;
            }
            case Action::Kind::kSendGrad: {
                const int s = slot_of[c][mb];
                post_send(chunk.grad_input(s), act, a.peer_stage, tag(mb, k - 1, 1));
                free_slots[c].push_back(s);  // the data is in the send pool now
                slot_of[c][mb] = -1;
                break;
            }
        }
    }
    wait_sends();
    for (auto& c : chunks_) c->finish_gradients();
    // the tied embedding: first and last stage each hold wte; their gradients are summed
    if (wte_index_ >= 0 && groups_.embd && groups_.embd->size() > 1) {
        const ParamInfo& p = table_[static_cast<size_t>(wte_index_)];
        groups_.embd->all_reduce(std::span<float>(grads() + p.offset, static_cast<size_t>(p.numel)), ReduceOp::kSum)
            .wait();
    }
    if (buckets_ != nullptr) buckets_->finish();
    float mean = loss / static_cast<float>(num_microbatches_);
    pp.all_reduce(std::span<float>(&mean, 1), ReduceOp::kSum).wait();  // only the last stage contributes
    return mean;
}

std::optional<float> PipelineModel::evaluate(const Sampler& sampler, int64_t micro_batches, int T,
                                             const std::function<bool()>& stop) {
    const int pp_size = groups_.pp_size, K = pp_size * virtual_stages_;
    const size_t act = static_cast<size_t>(chunks_[0]->activation_elems(micro_batch_, T));
    Communicator& pp = *groups_.pp;
    float total = 0;
    for (int64_t i = 0; i < micro_batches; ++i) {
        const int64_t first = (i * groups_.dp_size + groups_.dp_rank) * micro_batch_;
        sampler.fill(first, micro_batch_, tokens_.data(), targets_.data());
        for (int k = 0; k < K; ++k) {  // model chunks in order; each rank runs the ones it holds
            if (k % pp_size != groups_.pp_rank) continue;
            Gpt& chunk = *chunks_[static_cast<size_t>(k / pp_size)];
            if (k > 0) {
                receive(chunk.input(0), act, (k - 1) % pp_size, tag(0, k - 1, 0));
            }
            const float l = chunk.forward(tokens_.data(), targets_.data(), micro_batch_, T, 0, 0.0f);  // no backward
            if (chunk.part().head) total += l;
            if (k < K - 1) post_send(chunk.output(0), act, (k + 1) % pp_size, tag(0, k, 0));
        }
        wait_sends();
        if (stop && stop()) return std::nullopt;
    }
    total /= static_cast<float>(micro_batches);
    pp.all_reduce(std::span<float>(&total, 1), ReduceOp::kSum).wait();
    return total;
}

}  // namespace ms
