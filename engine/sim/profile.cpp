// profile.cpp: op families and their work, the rate curves, the built-in device estimates and the cost model over a
// profile (profile.h). The profile file is profile_file.cpp's.
#include "engine/sim/profile.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "engine/core/check.h"
#include "engine/graph/report.h"
#include "engine/train/device_peak.h"

namespace ms::sim {

using graph::kNoTensor;
using graph::OpCode;

const char* family_name(OpFamily f) {
    switch (f) {
        case OpFamily::kMatmulForward:
            return "matmul_fwd";
        case OpFamily::kMatmulBackward:
            return "matmul_bwd";
        case OpFamily::kAttentionForward:
            return "attention_fwd";
        case OpFamily::kAttentionBackward:
            return "attention_bwd";
        case OpFamily::kNormForward:
            return "norm_fwd";
        case OpFamily::kNormBackward:
            return "norm_bwd";
        case OpFamily::kActivationForward:
            return "activation_fwd";
        case OpFamily::kActivationBackward:
            return "activation_bwd";
        case OpFamily::kResidual:
            return "residual";
        case OpFamily::kEmbeddingForward:
            return "embedding_fwd";
        case OpFamily::kEmbeddingBackward:
            return "embedding_bwd";
        case OpFamily::kCrossEntropy:
            return "cross_entropy";
        case OpFamily::kLmHeadLoss:
            return "lm_head_loss";
        case OpFamily::kAdamW:
            return "adamw";
        case OpFamily::kMemset:
            return "memset";
        case OpFamily::kCount:
            break;
    }
    return "?";
}

Bound family_bound(OpFamily f) {
    switch (f) {
        case OpFamily::kMatmulForward:
        case OpFamily::kMatmulBackward:
        case OpFamily::kAttentionForward:
        case OpFamily::kAttentionBackward:
        case OpFamily::kLmHeadLoss:
            return Bound::kCompute;
        default:
            return Bound::kMemory;
    }
}

namespace {

// N, K and M of a matmul whose input is x (N, K) and weight (M, K).
double matmul_nmk(const graph::Graph& g, graph::TensorId x, graph::TensorId weight) {
    const graph::TensorInfo& w = g.info(weight);
    return static_cast<double>(g.info(x).numel()) * static_cast<double>(w.shape.at(0));  // N K M = numel(x) M
}

// Causal attention's forward FLOPs over T rows: QK^T and PV, 2 T^2 NH HS each per sequence, halved by the mask.
double attention_flops(int64_t B, int64_t T, int64_t NH, int64_t HS) {
    return 2.0 * static_cast<double>(B) * static_cast<double>(T) * static_cast<double>(T) * static_cast<double>(NH) *
           static_cast<double>(HS);
}
double attention_flops(const graph::Graph& g, const graph::Node& n, graph::TensorId qkv_id) {
    if (n.op == OpCode::kCrossAttention || n.op == OpCode::kCrossAttentionBackward) {
        const graph::CrossAttentionShape s = graph::cross_attention_shape(g, n);  // T query rows x S keys, no mask
        return 4.0 * static_cast<double>(s.B * s.T * s.S * s.NH * s.HS);
    }
    if (n.op == OpCode::kRingAttention || n.op == OpCode::kRingAttentionBackward) {
        const graph::RingAttentionShape s = graph::ring_attention_shape(g, n);
        return (s.causal ? 1.0 : 2.0) * attention_flops(s.B, s.T, s.NH, s.HS);  // no mask: every key
    }
    const int64_t kv = attention_kv_heads(n.NH, n.NKV);
    const int64_t HS = g.info(qkv_id).shape.back() / (n.NH + 2 * kv);
    return attention_flops(n.B, n.T, n.NH, HS);
}

double bytes_of(const graph::Graph& g, graph::TensorId t) {
    return t == kNoTensor ? 0.0 : static_cast<double>(g.info(t).bytes());
}

// The embedding's bytes as it touches them: op_bytes counts the whole table, but the op reads (forward) or adds into
// (backward) only the rows of the tokens, N of them at most.
double embedding_bytes(const graph::Graph& g, const graph::Node& n) {
    const bool forward = n.op == OpCode::kEmbedding;
    const graph::TensorId tokens = n.in.at(0), rows = forward ? n.out.at(0) : n.in.at(1);
    const double pos = forward ? (n.in.size() > 2 ? bytes_of(g, n.in[2]) : 0.0)
                               : (n.out.size() > 1 ? 2.0 * bytes_of(g, n.out[1]) : 0.0);
    return bytes_of(g, tokens) + (forward ? 2.0 : 3.0) * bytes_of(g, rows) + pos;
}

}  // namespace

OpWork op_work(const graph::Graph& g, const graph::Node& n) {
    OpWork w;
    auto family = [&](OpFamily f) {
        w.family = f;
        w.bytes = static_cast<double>(graph::op_bytes(g, n).moved());
    };
    switch (n.op) {
        case OpCode::kMatmul:
        case OpCode::kMatmulGelu:
            family(OpFamily::kMatmulForward);
            w.flops = 2.0 * matmul_nmk(g, n.in.at(0), n.in.at(1));
            if (n.op == OpCode::kMatmulGelu) {  // kGelu's bytes: pre read, y written
                w.epilogue_family = OpFamily::kActivationForward;
                w.epilogue_bytes = bytes_of(g, n.out.at(0)) + bytes_of(g, n.out.at(1));
            }
            break;
        case OpCode::kMatmulBackward: {
            family(OpFamily::kMatmulBackward);
            const int products = n.out.at(0) == kNoTensor ? 1 : 2;  // dW, and dx when written
            w.flops = 2.0 * products * matmul_nmk(g, n.in.at(1), n.in.at(2));
            if (n.in.size() > 3 && n.in[3] != kNoTensor) {  // GELU's backward on dx, as kGeluBackward's bytes: pre
                w.epilogue_family = OpFamily::kActivationBackward;  // and dx read, dpre written (all pre's shape)
                w.epilogue_bytes = 3.0 * bytes_of(g, n.in[3]);
            }
            break;
        }
        case OpCode::kAttention:
        case OpCode::kRingAttention:
        case OpCode::kCrossAttention:
            family(OpFamily::kAttentionForward);
            w.flops = attention_flops(g, n, n.in.at(0));
            break;
        case OpCode::kAttentionBackward:
        case OpCode::kRingAttentionBackward:
        case OpCode::kCrossAttentionBackward:
            family(OpFamily::kAttentionBackward);
            w.flops = 2.0 * attention_flops(g, n, n.in.at(1));
            break;
        case OpCode::kLmHeadLoss: {
            family(OpFamily::kLmHeadLoss);
            const bool backward = n.in.size() > 3 && n.in[3] != kNoTensor;
            w.flops = (backward ? 6.0 : 2.0) * matmul_nmk(g, n.in.at(0), n.in.at(1));
            break;
        }
        case OpCode::kLayerNorm:
        case OpCode::kRmsNorm:
        case OpCode::kResidualLayerNorm:
            family(OpFamily::kNormForward);
            break;
        case OpCode::kLayerNormBackward:
        case OpCode::kRmsNormBackward:
            family(OpFamily::kNormBackward);
            break;
        case OpCode::kGelu:
        case OpCode::kSwiGlu:
        case OpCode::kRope:
            family(OpFamily::kActivationForward);
            break;
        case OpCode::kGeluBackward:
        case OpCode::kSwiGluBackward:
        case OpCode::kRopeBackward:
        case OpCode::kBiasGradient:
            family(OpFamily::kActivationBackward);
            break;
        case OpCode::kResidual:
            family(OpFamily::kResidual);
            break;
        case OpCode::kEmbedding:
            w.family = OpFamily::kEmbeddingForward;
            w.bytes = embedding_bytes(g, n);
            break;
        case OpCode::kEmbeddingBackward:
            w.family = OpFamily::kEmbeddingBackward;
            w.bytes = embedding_bytes(g, n);
            break;
        case OpCode::kGatherRows:  // the rows it copies, as the embedding (the lookup it is)
            w.family = OpFamily::kEmbeddingForward;
            w.bytes = bytes_of(g, n.in.at(1)) + 2.0 * bytes_of(g, n.out.at(0));
            break;
        case OpCode::kGatherRowsBackward:
            w.family = OpFamily::kEmbeddingBackward;
            w.bytes = bytes_of(g, n.in.at(0)) + 3.0 * bytes_of(g, n.in.at(1));
            break;
        case OpCode::kCrossEntropy:
        case OpCode::kCrossEntropyBackward:
            family(OpFamily::kCrossEntropy);
            break;
        case OpCode::kLoss:
        case OpCode::kLoadTokens:
        case OpCode::kLoadTargets:
        case OpCode::kLoadRows:
        case OpCode::kLoadConstant:
        case OpCode::kLossGradient:
            family(OpFamily::kMemset);
            break;
        case OpCode::kTpCopy:
        case OpCode::kAllReduce:
        case OpCode::kAllGather:
        case OpCode::kReduceScatter:
            break;  // the transfer is the simulator's, on the links; no local work
    }
    return w;
}

std::string OpShape::key() const { return fmt::format("{} {}", family_name(family), fmt::join(dims, "x")); }

std::optional<OpShape> op_shape(const graph::Graph& g, const graph::Node& n) {
    const auto present = [](graph::TensorId t) -> int64_t { return t != kNoTensor ? 1 : 0; };
    // N, K and M of a matmul of x by w (M, K)
    const auto nkm = [&](graph::TensorId x, graph::TensorId w) {
        const std::vector<int64_t>& ws = g.info(w).shape;
        return std::array<int64_t, 3>{g.info(x).numel() / ws.at(1), ws.at(1), ws.at(0)};
    };
    switch (n.op) {
        case OpCode::kMatmul:
        case OpCode::kMatmulGelu: {
            const auto [N, K, M] = nkm(n.in.at(0), n.in.at(1));
            return OpShape{OpFamily::kMatmulForward, {N, K, M, n.in.size() > 2 ? present(n.in[2]) : 0}};
        }
        case OpCode::kMatmulBackward: {
            const auto [N, K, M] = nkm(n.in.at(1), n.in.at(2));
            return OpShape{OpFamily::kMatmulBackward,
                           {N, K, M, present(n.out.at(0)), n.out.size() > 2 ? present(n.out[2]) : 0}};
        }
        case OpCode::kAttention:
        case OpCode::kAttentionBackward: {
            if (!n.causal) return std::nullopt;
            const int64_t kv = attention_kv_heads(n.NH, n.NKV);
            const graph::TensorId qkv = n.op == OpCode::kAttention ? n.in.at(0) : n.in.at(1);
            const int64_t HS = g.info(qkv).shape.back() / (n.NH + 2 * kv);
            return OpShape{n.op == OpCode::kAttention ? OpFamily::kAttentionForward : OpFamily::kAttentionBackward,
                           {n.B, n.T, n.NH, kv, HS}};
        }
        case OpCode::kLmHeadLoss: {
            if (n.in.size() <= 3 || n.in[3] == kNoTensor) return std::nullopt;  // without its backward
            const auto [N, C, V] = nkm(n.in.at(0), n.in.at(1));
            return OpShape{OpFamily::kLmHeadLoss, {N, C, V, n.vocab_valid}};
        }
        default:
            return std::nullopt;
    }
}

double adamw_bytes_per_element(DType weights) {
    const double fp32 = 4.0;
    const double copy = weights == DType::kF32 ? 0.0 : static_cast<double>(dtype_size(weights));
    return 4 * fp32 + 3 * fp32 + copy;  // read weight, gradient, m, v; write weight, m, v (and the 16-bit copy)
}

double FamilyCurve::rate_at(double work) const {
    MS_CHECK(!points.empty(), "rate_at: a family curve without points");
    if (work <= points.front().work) return points.front().rate;
    if (work >= points.back().work) return points.back().rate;
    const auto hi =
        std::upper_bound(points.begin(), points.end(), work, [](double w, const RatePoint& p) { return w < p.work; });
    const auto lo = hi - 1;
    const double f = std::log(work / lo->work) / std::log(hi->work / lo->work);
    return lo->rate + f * (hi->rate - lo->rate);
}

const double* DTypeTable::measured_seconds(const OpShape& s) const {
    if (shape_seconds.empty()) return nullptr;
    const auto it = shape_seconds.find(s.key());
    return it != shape_seconds.end() ? &it->second : nullptr;
}

const DTypeTable* Profile::table(DType act) const {
    for (const DTypeTable& t : tables)
        if (t.dtype == act) return &t;
    return nullptr;
}

bool Profile::operator==(const Profile& o) const {
    auto same = [](const LinkParams& a, const LinkParams& b) {
        return a.alpha_s == b.alpha_s && a.bytes_per_s == b.bytes_per_s && a.reduce_bytes_per_s == b.reduce_bytes_per_s;
    };
    return version == o.version && name == o.name && device == o.device && backend == o.backend &&
           threads == o.threads && cores == o.cores && date == o.date && estimate == o.estimate && source == o.source &&
           memory_bytes_per_s == o.memory_bytes_per_s && device_memory_bytes == o.device_memory_bytes &&
           same(intra_node, o.intra_node) && same(inter_node, o.inter_node) && links_source == o.links_source &&
           tables == o.tables;
}

// ---- built-in estimates ----

namespace {

struct EstimateSpec {
    const char* name;           // what --profile calls it
    const char* device;         // the CUDA device name, as device_peak.cpp's table matches it
    double hbm_bytes_per_s;     // datasheet memory bandwidth
    int64_t memory_bytes;       // datasheet memory
    double nvlink_bytes_per_s;  // per GPU, one direction, through NVSwitch (NCCL's bus bandwidth)
    double ib_bytes_per_s;      // per GPU: one InfiniBand NIC
};
// NVIDIA's datasheets: A100 SXM4 80GB (HBM2e 2,039 GB/s, NVLink 3 600 GB/s both directions), H100 SXM5 (HBM3
// 3.35 TB/s, NVLink 4 900 GB/s both directions), H200 SXM (HBM3e 4.8 TB/s, 141 GB); one HDR 200 Gb/s NIC per A100
// (DGX A100), one NDR 400 Gb/s per H100 / H200 (DGX H100 / H200).
constexpr EstimateSpec kEstimates[] = {
    {"a100-80g", "NVIDIA A100-SXM4-80GB", 2.039e12, int64_t{80} << 30, 300e9, 25e9},
    {"h100", "NVIDIA H100 80GB HBM3", 3.35e12, int64_t{80} << 30, 450e9, 50e9},
    {"h200", "NVIDIA H200", 4.8e12, int64_t{141'000'000'000}, 450e9, 50e9},
};

// Efficiencies the estimates assume. The tensor-core GEMMs' is an effective rate, not cuBLAS's best (about 80% of the
// peak on large shapes): tuned so that the simulator gives Megatron-LM's 145.6B row of its weak-scaling table
// (Narayanan et al. 2021, Table 1: 148 TFLOP/s per A100 at tp 8, pp 8, 1536 GPUs) on the a100-80g estimate, it
// carries what the simulator leaves out (launch gaps, unfused softmax and dropout); the other rows are checked
// against it in tests/sim/test_published.cpp. fp32 SGEMM on the SIMT cores about 85%; fused attention less
// (FlashAttention-2 reports ~70% of the A100's peak forward, less backward; these are this project's own kernels, so
// lower); streaming ops about 80% of HBM. Small ops reach less: each op pays a launch overhead, and its rate ramps
// up as rate(w) = best * w / (w + best * kRampSeconds), i.e. an op pays another kRampSeconds filling the device.
constexpr double kTensorCoreGemmEfficiency = 0.54;
constexpr double kSimtGemmEfficiency = 0.85;
constexpr double kAttentionForwardEfficiency = 0.5;
constexpr double kAttentionBackwardEfficiency = 0.4;
constexpr double kHbmEfficiency = 0.8;
constexpr double kLaunchSeconds = 2e-6;
constexpr double kRampSeconds = 3e-6;
// NCCL's per-step latency inside a node (NVLink) and between nodes (InfiniBand): a few microseconds.
constexpr double kNvlinkAlphaSeconds = 3e-6;
constexpr double kInfinibandAlphaSeconds = 6e-6;

FamilyCurve ramp_curve(double best_rate, double first_work, double last_work) {
    FamilyCurve c;
    c.overhead_s = kLaunchSeconds;
    for (double w = first_work; w <= last_work * 1.0001; w *= 10)
        c.points.push_back({w, best_rate * w / (w + best_rate * kRampSeconds)});
    return c;
}

DTypeTable estimate_table(const EstimateSpec& s, const DevicePeak& peak, DType act) {
    DTypeTable t;
    t.dtype = act;
    const bool tensor_cores = act != DType::kF32;
    t.matmul_peak_flops = tensor_cores ? peak.bf16 : peak.fp32;
    t.peak_source = fmt::format("engine/train/device_peak.cpp: {} dense {}", peak.device,
                                tensor_cores ? "bf16 / fp16 tensor cores" : "fp32 without tensor cores");
    const double gemm = t.matmul_peak_flops * (tensor_cores ? kTensorCoreGemmEfficiency : kSimtGemmEfficiency);
    for (size_t i = 0; i < kNumFamilies; ++i) {
        const auto f = static_cast<OpFamily>(i);
        double best = s.hbm_bytes_per_s * kHbmEfficiency;
        if (f == OpFamily::kMatmulForward || f == OpFamily::kMatmulBackward || f == OpFamily::kLmHeadLoss) best = gemm;
        if (f == OpFamily::kAttentionForward) best = t.matmul_peak_flops * kAttentionForwardEfficiency;
        if (f == OpFamily::kAttentionBackward) best = t.matmul_peak_flops * kAttentionBackwardEfficiency;
        // FLOPs from 1 MFLOP to 10 PFLOP, bytes from 1 KB to 10 GB: a decade a point
        t.of(f) = family_bound(f) == Bound::kCompute ? ramp_curve(best, 1e6, 1e16) : ramp_curve(best, 1e3, 1e10);
    }
    return t;
}

}  // namespace

std::vector<std::string> estimate_profile_names() {
    std::vector<std::string> names;
    for (const EstimateSpec& s : kEstimates) names.emplace_back(s.name);
    return names;
}

Profile estimate_profile(std::string_view device) {
    for (const EstimateSpec& s : kEstimates) {
        if (device != s.name) continue;
        const DevicePeak* peak = find_device_peak(s.device);
        MS_CHECK(peak != nullptr, "estimate_profile: device_peak.cpp has no entry for '{}'", s.device);
        Profile p;
        p.name = s.name;
        p.device = s.device;
        p.backend = "cuda";
        p.date = "";
        p.estimate = true;
        p.source = fmt::format(
            "estimate from published peaks ({} dense, {:.2f} TB/s HBM) and assumed efficiencies (engine/sim/"
            "profile.cpp), not measured",
            peak->device, s.hbm_bytes_per_s / 1e12);
        p.memory_bytes_per_s = s.hbm_bytes_per_s * kHbmEfficiency;
        p.device_memory_bytes = s.memory_bytes;
        p.intra_node = {kNvlinkAlphaSeconds, s.nvlink_bytes_per_s};
        p.inter_node = {kInfinibandAlphaSeconds, s.ib_bytes_per_s};
        p.links_source = fmt::format(
            "estimate: NVLink/NVSwitch {:.0f} GB/s per GPU inside a node, InfiniBand {:.0f} "
            "GB/s per GPU between nodes",
            s.nvlink_bytes_per_s / 1e9, s.ib_bytes_per_s / 1e9);
        for (DType act : {DType::kF32, DType::kBF16, DType::kF16}) p.tables.push_back(estimate_table(s, *peak, act));
        return p;
    }
    std::string names;
    for (const std::string& n : estimate_profile_names()) names += (names.empty() ? "" : ", ") + n;
    throw UserError(fmt::format(
        "profile error: there is no built-in estimate for '{}'; the estimates are {}\n---> HINT: for another device, "
        "measure a profile there with `mindspeed-train calibrate --output FILE` and pass the file",
        device, names));
}

// ---- the cost model ----

ProfileCostModel::ProfileCostModel(Profile p) : p_(std::move(p)) {
    MS_CHECK(!p_.tables.empty(), "ProfileCostModel: profile '{}' holds no dtype table", p_.name);
}

std::string ProfileCostModel::describe() const {
    if (p_.estimate)
        return fmt::format("{}: ESTIMATE -- an estimate for {} from published peaks, not measured", p_.name, p_.device);
    return fmt::format("{}: {} ({}{}), measured {}", p_.name, p_.device, p_.backend,
                       p_.threads > 0 ? fmt::format(", {} thread{} a rank on {} cores", p_.threads,
                                                    p_.threads > 1 ? "s" : "", p_.cores)
                                      : std::string(),
                       p_.date);
}

const DTypeTable& ProfileCostModel::table(DType act) const {
    if (const DTypeTable* t = p_.table(act)) return *t;
    std::string held;
    for (const DTypeTable& t : p_.tables) held += fmt::format("{}{}", held.empty() ? "" : ", ", dtype_name(t.dtype));
    throw UserError(
        fmt::format("profile error: profile '{}' has no {} measurements (it holds {})\n---> HINT: measure them with "
                    "`mindspeed-train calibrate --dtype {} --output FILE`, or plan with mixed_precision.dtype: {}",
                    p_.name, dtype_name(act), held, dtype_name(act), dtype_name(p_.tables.front().dtype)));
}

namespace {

double epilogue_seconds(const DTypeTable& t, const OpWork& w) {
    return w.epilogue_bytes > 0 ? w.epilogue_bytes / t.of(w.epilogue_family).rate_at(w.epilogue_bytes) : 0.0;
}

}  // namespace

double ProfileCostModel::seconds(const OpWork& w, DType act) const {
    if (w.flops == 0 && w.bytes == 0) return 0;
    const DTypeTable& t = table(act);
    const FamilyCurve& c = t.of(w.family);
    const bool compute = family_bound(w.family) == Bound::kCompute;
    const double flop_rate = compute ? c.rate_at(w.flops) : t.matmul_peak_flops;
    const double byte_rate = compute ? p_.memory_bytes_per_s : c.rate_at(w.bytes);
    return c.overhead_s + std::max(w.flops / flop_rate, w.bytes / byte_rate) + epilogue_seconds(t, w);
}

double ProfileCostModel::op_seconds(const graph::Graph& g, const graph::Node& n) const {
    const OpWork w = op_work(g, n);
    const DTypeTable& t = table(g.act);
    if (!t.shape_seconds.empty()) {
        const std::optional<OpShape> s = op_shape(g, n);
        if (const double* measured = s ? t.measured_seconds(*s) : nullptr) return *measured + epilogue_seconds(t, w);
    }
    return seconds(w, g.act);
}

double ProfileCostModel::optimizer_seconds(int64_t elements, DType weights) const {
    if (elements == 0) return 0;
    return seconds({OpFamily::kAdamW, 0, static_cast<double>(elements) * adamw_bytes_per_element(weights)}, weights);
}

double ProfileCostModel::memory_seconds(int64_t bytes) const {
    return seconds({OpFamily::kMemset, 0, static_cast<double>(bytes)}, p_.tables.front().dtype);
}

double ProfileCostModel::peak_flops(DType act) const { return table(act).matmul_peak_flops; }

double ProfileCostModel::oversubscription(int ranks_per_host) const {
    if (p_.cores <= 0) return 1;
    return std::max(1.0, static_cast<double>(ranks_per_host) * std::max(p_.threads, 1) / p_.cores);
}

LinkModel ProfileCostModel::links() const {
    return LinkModel{.intra = p_.intra_node, .inter = p_.inter_node, .occupancy = nullptr};
}

}  // namespace ms::sim
