// memory_plan.cpp: liveness over the representative graph and the two-level plan (memory_plan.h).
#include "engine/graph/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

#include "engine/core/check.h"

namespace ms::graph {
namespace {

size_t align(size_t bytes) { return (bytes + kMemoryAlign - 1) / kMemoryAlign * kMemoryAlign; }

// A tensor's lifetime in steps and whether a micro-batch keeps it between its calls.
struct Lifetime {
    int first = INT_MAX, last = -1;
    bool slot = false;
    bool crosses = false;  // an op of another layer touches it (a layer's output read by the next layer's first op)
};

// The step of op i: forward ops keep their index; the hand-off step sits between them and the backward ops.
int step_of(size_t i, int forward) {
    return static_cast<int>(i) < forward ? static_cast<int>(i) : static_cast<int>(i) + 1;
}

std::vector<Lifetime> lifetimes(const Graph& g) {
    const int forward = g.num_forward();
    const int handoff = forward, end = static_cast<int>(g.nodes.size()) + 1;
    std::vector<Lifetime> life(g.tensors.size());
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        const int step = step_of(i, forward);
        for (const auto* list : {&g.nodes[i].in, &g.nodes[i].out}) {
            for (TensorId t : *list) {
                if (t == kNoTensor) continue;
                Lifetime& l = life[static_cast<size_t>(t)];
                l.first = std::min(l.first, step);
                l.last = std::max(l.last, step);
                const int layer = g.tensors[static_cast<size_t>(t)].layer;
                if (layer >= 0 && g.nodes[i].layer != layer) l.crosses = true;
            }
        }
    }
    for (size_t t = 0; t < g.tensors.size(); ++t) {
        Lifetime& l = life[t];
        const TensorInfo& info = g.tensors[t];
        if (is_parameter_memory(info.role) || l.last < 0) {
            l.last = -1;  // no memory here
            continue;
        }
        l.slot = l.first < handoff && l.last > handoff;  // kept from the forward to the backward
        switch (info.role) {
            case Role::kInput:
                l.first = 0;
                l.slot = true;
                break;
            case Role::kOutput:
                l.last = info.read_after_backward ? end : std::max(l.last, handoff);
                l.slot = true;
                break;
            case Role::kGradInput:
                l.first = std::min(l.first, handoff);
                l.last = end;
                l.slot = true;
                break;
            default:
                break;
        }
    }
    return life;
}

}  // namespace

std::string layer_key(const TensorInfo& t) {
    if (t.layer < 0) return t.name;
    const std::string prefix = fmt::format("h.{}.", t.layer);
    const size_t at = t.name.find(prefix);
    MS_CHECK(at != std::string::npos, "memory plan: tensor '{}' of layer {} is not named h.{}.*", t.name, t.layer,
             t.layer);
    return t.name.substr(0, at) + "h.*." + t.name.substr(at + prefix.size());
}

MemoryPlan plan_graph_memory(const Graph& g, int first_layer, int num_layers, int leading, bool one_block) {
    const std::vector<Lifetime> life = lifetimes(g);
    MemoryPlan p;
    p.first_layer = first_layer;
    p.num_layers = num_layers;
    p.leading = std::clamp(leading, 0, num_layers);
    const int forward = g.num_forward();
    // the steps of the layers' forward ops and of their backward ops
    int begin[2] = {INT_MAX, INT_MAX}, end[2] = {-1, -1};
    for (size_t i = 0; i < g.nodes.size(); ++i) {
        if (g.nodes[i].layer < 0) continue;
        const int phase = static_cast<int>(i) < forward ? 0 : 1;
        const int step = step_of(i, forward);
        begin[phase] = std::min(begin[phase], step);
        end[phase] = std::max(end[phase], step);
    }
    // layer level, per kind: the representative layer's slot tensors side by side; the scratch tensors of every
    // kind planned together per phase. A scratch tensor another layer's op touches (the MLP's output, which the next
    // layer's fused residual+LayerNorm reads) is held over its own layer's whole phase too: then no tensor of any
    // layer of its kind shares its bytes, whichever layer follows, and the kinds, planned together, stay apart where
    // the block of one meets the other.
    const int num_kinds = p.leading < num_layers && p.leading > 0 ? 2 : 1;
    p.kinds.resize(static_cast<size_t>(num_kinds));
    std::vector<std::pair<int, std::string>> scratch_keys[2];  // [phase]: (kind, key) per request
    std::vector<BufferRequest> scratch_requests[2];
    for (int k = 0; k < num_kinds; ++k) {
        const int rep = first_layer + k;
        int range[2][2] = {{INT_MAX, -1}, {INT_MAX, -1}};  // [phase][first, last] steps of the layer's ops
        for (size_t i = 0; i < g.nodes.size(); ++i) {
            if (g.nodes[i].layer != rep) continue;
            const int phase = static_cast<int>(i) < forward ? 0 : 1, step = step_of(i, forward);
            range[phase][0] = std::min(range[phase][0], step);
            range[phase][1] = std::max(range[phase][1], step);
        }
        MemoryPlan::LayerKind& kind = p.kinds[static_cast<size_t>(k)];
        for (size_t t = 0; t < g.tensors.size(); ++t) {
            const TensorInfo& info = g.tensors[t];
            if (info.layer != rep || life[t].last < 0) continue;
            if (life[t].slot) {
                kind.own[layer_key(info)] = kind.slot_bytes;
                kind.slot_bytes += align(static_cast<size_t>(info.bytes()));
                continue;
            }
            const int phase = life[t].first < forward ? 0 : 1;
            int first = life[t].first, last = life[t].last;
            if (life[t].crosses) {
                first = std::min(first, range[phase][0]);
                last = std::max(last, range[phase][1]);
            }
            scratch_keys[phase].emplace_back(k, layer_key(info));
            scratch_requests[phase].push_back(
                BufferRequest{info.name, static_cast<size_t>(info.bytes()), first, last, -1});
        }
    }
    Plan layer_scratch[2];
    for (int phase = 0; phase < 2; ++phase) {
        layer_scratch[phase] = plan_buffers(scratch_requests[phase], kMemoryAlign);
        p.layer_scratch_requests[phase] = scratch_requests[phase];
        p.layer_scratch[phase] = layer_scratch[phase];
    }
    // chunk level
    std::vector<std::string> slot_names, scratch_names;
    for (size_t t = 0; t < g.tensors.size(); ++t) {
        const TensorInfo& info = g.tensors[t];
        if (info.layer >= 0 || life[t].last < 0) continue;
        auto& names = life[t].slot ? slot_names : scratch_names;
        auto& requests = life[t].slot ? p.slot_requests : p.scratch_requests;
        names.push_back(info.name);
        requests.push_back(
            BufferRequest{info.name, static_cast<size_t>(info.bytes()), life[t].first, life[t].last, -1});
    }
    int layers_request = -1, layer_scratch_request[2] = {-1, -1};
    if (num_layers > 0 && end[0] >= 0) {
        layers_request = static_cast<int>(p.slot_requests.size());
        p.slot_requests.push_back(
            BufferRequest{"layers", p.layer_slot_offset(num_layers), begin[0], std::max(end[0], end[1]), -1});
        for (int phase = 0; phase < 2; ++phase) {
            if (end[phase] < 0) continue;
            layer_scratch_request[phase] = static_cast<int>(p.scratch_requests.size());
            p.scratch_requests.push_back(BufferRequest{phase == 0 ? "layer_scratch.forward" : "layer_scratch.backward",
                                                       layer_scratch[phase].total_bytes, begin[phase], end[phase], -1});
        }
    }
    // chunk level placement: two blocks, or with one_block the scratch requests after the slot ones in one plan
    const MemGroup scratch_group = one_block ? MemGroup::kSlot : MemGroup::kScratch;
    const size_t slot_count = p.slot_requests.size();
    if (one_block) {
        std::vector<BufferRequest> all = p.slot_requests;
        all.insert(all.end(), p.scratch_requests.begin(), p.scratch_requests.end());
        p.slot = plan_buffers(all, kMemoryAlign);
        p.scratch.offsets.assign(p.slot.offsets.begin() + static_cast<std::ptrdiff_t>(slot_count),
                                 p.slot.offsets.end());
        p.slot.offsets.resize(slot_count);
    } else {
        p.slot = plan_buffers(p.slot_requests, kMemoryAlign);
        p.scratch = plan_buffers(p.scratch_requests, kMemoryAlign);
    }
    for (size_t i = 0; i < slot_names.size(); ++i) p.chunk_places[slot_names[i]] = {MemGroup::kSlot, p.slot.offsets[i]};
    for (size_t i = 0; i < scratch_names.size(); ++i)
        p.chunk_places[scratch_names[i]] = {scratch_group, p.scratch.offsets[i]};
    if (layers_request >= 0) p.layers_offset = p.slot.offsets[static_cast<size_t>(layers_request)];
    for (int phase = 0; phase < 2; ++phase) {
        if (layer_scratch_request[phase] < 0) continue;
        const size_t base = p.scratch.offsets[static_cast<size_t>(layer_scratch_request[phase])];
        for (size_t i = 0; i < scratch_keys[phase].size(); ++i) {
            const auto& [k, key] = scratch_keys[phase][i];
            p.kinds[static_cast<size_t>(k)].shared[key] = {scratch_group, base + layer_scratch[phase].offsets[i]};
        }
    }
    return p;
}

size_t MemoryPlan::layer_slot_offset(int index) const {
    if (kinds.empty()) return 0;
    const size_t first = static_cast<size_t>(std::min(index, leading));
    const size_t rest = static_cast<size_t>(std::max(0, index - leading));
    return first * kinds[0].slot_bytes + rest * kinds.back().slot_bytes;
}

MemoryPlan::Place MemoryPlan::place(const Graph& g, TensorId t) const {
    const TensorInfo& info = g.info(t);
    if (is_parameter_memory(info.role)) return {};
    const std::string key = layer_key(info);
    if (info.layer < 0) {
        const auto it = chunk_places.find(key);
        return it == chunk_places.end() ? Place{} : it->second;
    }
    const int index = info.layer - first_layer;
    MS_CHECK(index >= 0 && index < num_layers,
             "memory plan: tensor '{}' of layer {} outside the planned layers [{}, {})", info.name, info.layer,
             first_layer, first_layer + num_layers);
    const LayerKind& kind = kinds[index < leading ? 0 : kinds.size() - 1];
    if (const auto own = kind.own.find(key); own != kind.own.end())
        return {MemGroup::kSlot, layers_offset + layer_slot_offset(index) + own->second};
    const auto shared = kind.shared.find(key);
    return shared == kind.shared.end() ? Place{} : shared->second;
}

}  // namespace ms::graph
