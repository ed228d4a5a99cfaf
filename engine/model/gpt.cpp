// gpt.cpp: GPT-2 forward and backward over the Backend interface (layouts and contracts in gpt.h, backend.h).
#include "engine/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <utility>

#include "engine/core/philox.h"
#include "engine/model/gpt_activations.h"

namespace ms {
namespace {

// Parameters start on 64-byte boundaries so the fused elementwise passes vectorise cleanly.
constexpr int64_t kParamAlign = 16;

int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// gpt_param_table() order: wte (embedding or head), wpe (embedding), then kParamsPerLayer entries per layer in the
// order the table adds them (ln_1.{weight,bias}, attn.c_attn.{weight,bias}, attn.c_proj.{weight,bias},
// ln_2.{weight,bias}, mlp.c_fc.{weight,bias}, mlp.c_proj.{weight,bias}), then ln_f.{weight,bias} (head).
constexpr int kParamsPerLayer = 12;

int part_layers(const GptShape& s, const GptPart& part) {
    return part.num_layers < 0 ? s.L - part.first_layer : part.num_layers;
}

}  // namespace

std::vector<ParamInfo> gpt_param_table(const GptShape& s, int tp, const GptPart& part) {
    MS_CHECK(tp >= 1 && s.NH % tp == 0 && s.F % tp == 0 && s.Vp % tp == 0,
             "tensor-parallel size {} must divide heads {}, ffn {} and padded vocab {}", tp, s.NH, s.F, s.Vp);
    const int num_layers = part_layers(s, part);
    MS_CHECK(part.first_layer >= 0 && num_layers >= 0 && part.first_layer + num_layers <= s.L,
             "model part: layers [{}, {}) outside [0, {})", part.first_layer, part.first_layer + num_layers, s.L);
    std::vector<ParamInfo> t;
    int64_t offset = 0;
    const float proj = std::sqrt(2.0f * static_cast<float>(s.L));  // the residual projections' init divisor
    // divisor 0: constant `value`; else N(0, (init_std / divisor)^2)
    auto add = [&](std::string name, std::vector<int64_t> global, ShardKind shard, float divisor, float value) {
        ParamInfo p;
        p.name = std::move(name);
        p.global_shape = global;
        p.shard = shard;
        p.shape = std::move(global);
        if (shard == ShardKind::kRows || shard == ShardKind::kQkvRows) p.shape[0] /= tp;
        if (shard == ShardKind::kCols) p.shape[1] /= tp;
        p.numel = 1;
        for (int64_t d : p.shape) p.numel *= d;
        p.offset = offset;
        p.weight_decay = p.shape.size() >= 2;
        p.init = divisor > 0.0f ? InitKind::kNormal : InitKind::kConstant;
        p.init_divisor = divisor > 0.0f ? divisor : 1.0f;
        p.init_value = value;
        offset = align_up(offset + p.numel, kParamAlign);
        t.push_back(std::move(p));
    };
    const int64_t C = s.C, F = s.F;
    using K = ShardKind;
    if (part.embedding || part.head) {
        add("wte.weight", {s.Vp, C}, K::kRows, 1, 0);
        t.back().pp_duplicate = !part.embedding;
    }
    if (part.embedding) add("wpe.weight", {s.T, C}, K::kReplicated, 1, 0);
    for (int l = part.first_layer; l < part.first_layer + num_layers; ++l) {
        const std::string h = "h." + std::to_string(l) + ".";
        add(h + "ln_1.weight", {C}, K::kReplicated, 0, 1);
        add(h + "ln_1.bias", {C}, K::kReplicated, 0, 0);
        add(h + "attn.c_attn.weight", {3 * C, C}, K::kQkvRows, 1, 0);
        add(h + "attn.c_attn.bias", {3 * C}, K::kQkvRows, 0, 0);
        add(h + "attn.c_proj.weight", {C, C}, K::kCols, proj, 0);
        add(h + "attn.c_proj.bias", {C}, K::kReplicated, 0, 0);
        add(h + "ln_2.weight", {C}, K::kReplicated, 0, 1);
        add(h + "ln_2.bias", {C}, K::kReplicated, 0, 0);
        add(h + "mlp.c_fc.weight", {F, C}, K::kRows, 1, 0);
        add(h + "mlp.c_fc.bias", {F}, K::kRows, 0, 0);
        add(h + "mlp.c_proj.weight", {C, F}, K::kCols, proj, 0);
        add(h + "mlp.c_proj.bias", {C}, K::kReplicated, 0, 0);
    }
    if (part.head) {
        add("ln_f.weight", {C}, K::kReplicated, 0, 1);
        add("ln_f.bias", {C}, K::kReplicated, 0, 0);
    }
    return t;
}

int64_t ParamInfo::global_index(int64_t i, int tp_rank, int tp_size) const {
    const int64_t cols = shape.size() >= 2 ? shape[1] : 1;  // local row length
    const int64_t row = i / cols, col = i % cols;
    switch (shard) {
        case ShardKind::kReplicated:
            return i;
        case ShardKind::kRows:
            return (tp_rank * shape[0] + row) * cols + col;
        case ShardKind::kCols:
            return row * global_shape[1] + tp_rank * cols + col;
        case ShardKind::kQkvRows: {
            // local rows [Q_r | K_r | V_r], each global_shape[0] / 3 / tp rows; global rows [Q | K | V]
            const int64_t block_rows = global_shape[0] / 3, local_block = block_rows / tp_size;
            const int64_t block = row / local_block, within = row % local_block;
            return (block * block_rows + tp_rank * local_block + within) * cols + col;
        }
    }
    return i;
}

int64_t gpt_num_params(const GptShape& s) {
    int64_t n = 0;
    for (const ParamInfo& p : gpt_param_table(s)) n += p.numel;
    return n;
}

double gpt_train_flops_per_token(const GptShape& s, int seq_length) {
    // Megatron's num_floating_point_operations for a dense GPT (forward + backward = 3x forward), per token:
    // 72 L C^2 (1 + T/(6C) + Vp/(12 L C)) with ffn = 4C; written out for a general ffn size.
    const double L = s.L, C = s.C, T = seq_length, F = s.F, Vp = s.Vp;
    const double per_layer = 2.0 * (3 * C * C + C * C + 2 * C * F) + 2.0 * 2.0 * T * C;  // GEMMs + QK^T, PV
    return 3.0 * (L * per_layer + 2.0 * C * Vp);
}

// Everything one forward/backward needs besides parameters and gradients; sized for max_batch * T rows (N). Under
// sequence parallelism the residual stream and LayerNorm statistics hold this rank's N / tp rows. Pointers into a
// slot block or the shared scratch block, as engine/model/gpt_activations.h plans them; nullptr when not held.
struct Gpt::Activations {  // void*: the activation dtype; float*: fp32 statistics
    struct Layer {
        void* ln1 = nullptr;        // (N, C)
        float* ln1_mean = nullptr;  // (N)
        float* ln1_rstd = nullptr;  // (N)
        void* qkv = nullptr;        // (N, 3C/tp)
        void* atty = nullptr;       // (N, C/tp)
        float* lse = nullptr;       // (B, NH/tp, T)
        void* res2 = nullptr;       // (N, C) residual after attention
        void* ln2 = nullptr;        // (N, C)
        float* ln2_mean = nullptr;  // (N)
        float* ln2_rstd = nullptr;  // (N)
        void* fch = nullptr;        // (N, F/tp) pre-GELU
        void* fch_gelu = nullptr;   // (N, F/tp)
        void* res3 = nullptr;       // (N, C) residual after the MLP = the layer's output
        // backward scratch of this layer (the plan lets dfch share memory with datty and dqkv)
        void* dfch = nullptr;   // (N, F/tp)
        void* datty = nullptr;  // (N, C/tp)
        void* dqkv = nullptr;   // (N, 3C/tp)
    };
    std::vector<Layer> layers;
    void* encoded = nullptr;     // (N, C)
    void* lnf = nullptr;         // (N, C)               head only
    float* lnf_mean = nullptr;   // (N)                  head only
    float* lnf_rstd = nullptr;   // (N)                  head only
    void* logits = nullptr;      // (N, Vp/tp), dlogits after backward; head only
    float* losses = nullptr;     // (N)                  head only
    float* row_max = nullptr;    // (N)                  head only
    float* sum_exp = nullptr;    // (2, N): sum_exp, then from sum_exp + B*T of the call the target logits, so one
                                 // all-reduce covers both; head only
    int32_t* tokens = nullptr;   // (N) the last forward's inputs (for the embedding backward); embedding only
    int32_t* targets = nullptr;  // (N)                  head only
    void* dout = nullptr;        // (N, C) gradient of the output; parts without the head
    void* dinp = nullptr;        // (N, C) gradient of the input; parts without the embedding
    // scratch shared by all slots
    void* proj_out = nullptr;  // (N, C) c_proj outputs before the residual add (forward)
    void* dres = nullptr;      // (N, C) gradient of the residual stream
    void* dln = nullptr;       // (N, C)
    float* dloss = nullptr;    // (N) head only
    // sequence parallelism only: staging around the all-gathers and reduce-scatters
    void* sp_local = nullptr;  // (N / tp, C) a LayerNorm's local output, a reduce-scatter's result
    void* sp_full = nullptr;   // (N, C) a gathered gradient, the embedding's partial sums
};

// Points the field of `a` that `buf` names at p.
void Gpt::bind(Activations& a, const GptBuffer& buf, std::byte* p) {
    using L = Activations::Layer;
    using A = Activations;
    static constexpr std::pair<GptBuf, void * L::*> kLayerActs[] = {
        {GptBuf::kLn1, &L::ln1},          {GptBuf::kQkv, &L::qkv},   {GptBuf::kAtty, &L::atty},
        {GptBuf::kRes2, &L::res2},        {GptBuf::kLn2, &L::ln2},   {GptBuf::kFch, &L::fch},
        {GptBuf::kFchGelu, &L::fch_gelu}, {GptBuf::kRes3, &L::res3}, {GptBuf::kDfch, &L::dfch},
        {GptBuf::kDatty, &L::datty},      {GptBuf::kDqkv, &L::dqkv}};
    static constexpr std::pair<GptBuf, float * L::*> kLayerStats[] = {{GptBuf::kLn1Mean, &L::ln1_mean},
                                                                      {GptBuf::kLn1Rstd, &L::ln1_rstd},
                                                                      {GptBuf::kLse, &L::lse},
                                                                      {GptBuf::kLn2Mean, &L::ln2_mean},
                                                                      {GptBuf::kLn2Rstd, &L::ln2_rstd}};
    static constexpr std::pair<GptBuf, void * A::*> kChunkActs[] = {
        {GptBuf::kEncoded, &A::encoded}, {GptBuf::kLnf, &A::lnf},   {GptBuf::kLogits, &A::logits},
        {GptBuf::kDout, &A::dout},       {GptBuf::kDinp, &A::dinp}, {GptBuf::kProjOut, &A::proj_out},
        {GptBuf::kDres, &A::dres},       {GptBuf::kDln, &A::dln},   {GptBuf::kSpLocal, &A::sp_local},
        {GptBuf::kSpFull, &A::sp_full}};
    static constexpr std::pair<GptBuf, float * A::*> kChunkStats[] = {{GptBuf::kLnfMean, &A::lnf_mean},
                                                                      {GptBuf::kLnfRstd, &A::lnf_rstd},
                                                                      {GptBuf::kLosses, &A::losses},
                                                                      {GptBuf::kRowMax, &A::row_max},
                                                                      {GptBuf::kDloss, &A::dloss}};
    float* f = reinterpret_cast<float*>(p);
    if (buf.id == GptBuf::kTokens) {
        a.tokens = reinterpret_cast<int32_t*>(p);
        return;
    }
    if (buf.id == GptBuf::kTargets) {
        a.targets = reinterpret_cast<int32_t*>(p);
        return;
    }
    if (buf.id == GptBuf::kSumExp) {
        a.sum_exp = f;
        return;
    }
    auto assign = [&](auto& object, const auto& acts, const auto& stats) {
        for (const auto& [id, field] : acts) {
            if (id == buf.id) {
                object.*field = p;
                return true;
            }
        }
        for (const auto& [id, field] : stats) {
            if (id == buf.id) {
                object.*field = f;
                return true;
            }
        }
        return false;
    };
    const bool bound = buf.layer >= 0 ? assign(a.layers.at(static_cast<size_t>(buf.layer)), kLayerActs, kLayerStats)
                                      : assign(a, kChunkActs, kChunkStats);
    if (!bound) MS_UNREACHABLE("activation buffer '{}' (layer {}) has no field", gpt_buf_name(buf.id), buf.layer);
}

Gpt::Gpt(const GptShape& shape, Backend& backend, Communicator& tp, const Options& o)
    : shape_(shape), backend_(backend), tp_(tp), max_batch_(o.max_batch), part_(o.part), dtype_(o.dtype) {
    MS_CHECK(is_float(dtype_), "model dtype {} is not fp32, bf16 or fp16", dtype_name(dtype_));
    MS_CHECK(shape.C % shape.NH == 0, "hidden {} not divisible by heads {}", shape.C, shape.NH);
    MS_CHECK(shape.Vp >= shape.V, "padded vocab {} < vocab {}", shape.Vp, shape.V);
    MS_CHECK(o.num_slots >= 1, "num_slots {} < 1", o.num_slots);
    table_ = gpt_param_table(shape_, tp.size(), part_);
    const int num_layers = part_layers(shape_, part_);
    int index = 0;
    if (part_.embedding || part_.head) wte_ = index++;
    if (part_.embedding) wpe_ = index++;
    first_layer_param_ = index;
    if (part_.head) ln_f_ = index + num_layers * kParamsPerLayer;
    NH_local_ = shape.NH / tp.size();
    C_local_ = NH_local_ * (shape.C / shape.NH);
    F_local_ = shape.F / tp.size();
    Vp_local_ = shape.Vp / tp.size();
    sp_ = o.sequence_parallel && tp.size() > 1;
    MS_CHECK(!sp_ || (static_cast<int64_t>(o.max_batch) * shape.seq()) % tp.size() == 0,
             "sequence parallelism: B*T = {} rows do not split over tp = {}", o.max_batch * shape.seq(), tp.size());
    for (size_t i = 0; i < table_.size(); ++i) {
        const std::string& n = table_[i].name;
        if (n.find("ln_") != std::string::npos) layernorm_params_.push_back(static_cast<int>(i));
    }
    num_params_ = 0;
    for (const ParamInfo& p : table_) num_params_ += p.numel;
    // allocation names: "layers 0-5 slot 1", ...
    const std::string what = fmt::format("layers {}-{}", part_.first_layer, part_.first_layer + num_layers - 1);
    MS_CHECK((o.params == nullptr) == (o.grads == nullptr), "external params and grads: both or neither");
    const bool mixed = dtype_ != DType::kF32;
    if (o.params) {
        MS_CHECK(!mixed || o.weights != nullptr, "external params in {} need external weights too", dtype_name(dtype_));
        params_ptr_ = o.params;
        grads_ptr_ = o.grads;
        weights_ptr_ = mixed ? o.weights : o.params;
    } else {
        const size_t elems = static_cast<size_t>(std::max(flat_size(), o.flat_capacity));
        params_ = MemoryBlock(elems * sizeof(float), o.arena, MemCategory::kParameter, what + " params");
        grads_ = MemoryBlock(elems * sizeof(float), o.arena, MemCategory::kGradient, what + " grads");
        params_ptr_ = params_.as<float>();
        grads_ptr_ = grads_.as<float>();
        if (mixed) {
            weights_ = MemoryBlock(elems * dtype_size(dtype_), o.arena, MemCategory::kParameter,
                                   fmt::format("{} weights {}", what, dtype_name(dtype_)));
            weights_ptr_ = weights_.as<std::byte>();
        } else {
            weights_ptr_ = params_ptr_;
        }
    }

    const GptActivationPlan plan =
        plan_gpt_activations(shape, part_, tp.size(), o.max_batch, o.sequence_parallel, dtype_);
    scratch_block_ =
        MemoryBlock(static_cast<size_t>(plan.scratch_bytes()), o.arena, MemCategory::kWorkspace, what + " scratch");
    for (int i = 0; i < o.num_slots; ++i) {
        slot_blocks_.emplace_back(static_cast<size_t>(plan.slot_bytes()), o.arena, MemCategory::kActivation,
                                  fmt::format("{} slot {}", what, i));
        auto a = std::make_unique<Activations>();
        a->layers.resize(static_cast<size_t>(num_layers));
        for (const GptBuffer& buf : plan.buffers) {
            const bool slot = buf.group == GptBufGroup::kSlot;
            std::byte* base = (slot ? slot_blocks_.back() : scratch_block_).as<std::byte>();
            const Plan& p = slot ? plan.slot : plan.scratch;
            bind(*a, buf, base + p.offsets[static_cast<size_t>(buf.request)]);
        }
        slots_.push_back(std::move(a));
    }
}

Gpt::~Gpt() = default;

const ParamInfo& Gpt::param(const std::string& name) const {
    for (const ParamInfo& p : table_)
        if (p.name == name) return p;
    MS_UNREACHABLE("no parameter named '{}'", name);
}

void Gpt::init_weights(uint64_t seed, float init_std) {
    MS_CHECK(init_std > 0.0f && std::isfinite(init_std), "init std {} is not a positive number", init_std);
    backend_.synchronize();  // the host writes the parameters
    float* w = params();
    for (const ParamInfo& p : table_) {
        float* dst = w + p.offset;
        if (p.init == InitKind::kConstant) {
            for (int64_t i = 0; i < p.numel; ++i) dst[i] = p.init_value;
            continue;
        }
        const uint64_t stream = name_hash(p.name);
        // Rows of wte past the real vocabulary are never looked up and their logits are masked: keep them 0.
        const int64_t live = p.name == "wte.weight" ? static_cast<int64_t>(shape_.V) * shape_.C : INT64_MAX;
        const int tp_rank = tp_.rank(), tp_size = tp_.size();
        const float std_p = p.std_for(init_std);
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < p.numel; ++i) {
            const int64_t g = p.global_index(i, tp_rank, tp_size);
            dst[i] = g < live ? std_p * philox_normal(seed, stream, static_cast<uint64_t>(g)) : 0.0f;
        }
    }
    refresh_weights();
}

void Gpt::refresh_weights() {
    if (dtype_ == DType::kF32) return;
    backend_.cast({Tensor::f32(params(), {flat_size()}), Tensor(weights_ptr_, dtype_, {flat_size()})});
}

void Gpt::zero_grads() { backend_.zero(Tensor::f32(grads(), {table_.back().offset + table_.back().numel})); }

Tensor Gpt::logits_tensor() const {
    const int64_t N = static_cast<int64_t>(B_ > 0 ? B_ : max_batch_) * (T_ > 0 ? T_ : shape_.seq());
    return Tensor(slots_[0]->logits, dtype_, {N, Vp_local_});
}
const float* Gpt::losses() const { return slots_[0]->losses; }
void* Gpt::input(int slot) { return slots_.at(static_cast<size_t>(slot))->encoded; }
const void* Gpt::output(int slot) const {
    const Activations& a = *slots_.at(static_cast<size_t>(slot));
    return a.layers.empty() ? a.encoded : a.layers.back().res3;
}
int64_t Gpt::activation_elems(int B, int T) const {
    return static_cast<int64_t>(B) * T * shape_.C / (sp_ ? tp_.size() : 1);
}
void* Gpt::grad_output(int slot) { return slots_.at(static_cast<size_t>(slot))->dout; }
const void* Gpt::grad_input(int slot) const { return slots_.at(static_cast<size_t>(slot))->dinp; }

namespace {
// all-reduce of n elements of dtype t over the tensor-parallel group
void tp_all_reduce(Communicator& tp, void* data, DType t, int64_t n, ReduceOp op = ReduceOp::kSum) {
    visit_float(t, [&](auto z) {
        using T = decltype(z);
        tp.all_reduce(std::span<T>(static_cast<T*>(data), static_cast<size_t>(n)), op, Priority::kHigh).wait();
    });
}
// sequence parallelism: local rows (n_local) of every TP rank -> all rows, in rank order
void tp_all_gather(Communicator& tp, const void* local, void* full, DType t, int64_t n_local) {
    visit_float(t, [&](auto z) {
        using T = decltype(z);
        tp.all_gather(std::span<const T>(static_cast<const T*>(local), static_cast<size_t>(n_local)),
                      std::span<T>(static_cast<T*>(full), static_cast<size_t>(n_local * tp.size())), Priority::kHigh)
            .wait();
    });
}
// partial sums of all rows -> this rank's rows of the sum
void tp_reduce_scatter(Communicator& tp, const void* partial, void* local, DType t, int64_t n_local) {
    visit_float(t, [&](auto z) {
        using T = decltype(z);
        tp.reduce_scatter(std::span<const T>(static_cast<const T*>(partial), static_cast<size_t>(n_local * tp.size())),
                          std::span<T>(static_cast<T*>(local), static_cast<size_t>(n_local)), ReduceOp::kSum,
                          Priority::kHigh)
            .wait();
    });
}
}  // namespace

float Gpt::forward(const int32_t* tokens, const int32_t* targets, int B, int T, int slot) {
    MS_CHECK(B >= 1 && B <= max_batch_, "batch {} outside [1, {}]", B, max_batch_);
    MS_CHECK(T >= 1 && T <= shape_.seq(), "sequence length {} outside [1, {}]", T, shape_.seq());
    B_ = B;
    T_ = T;
    Activations& a = *slots_.at(static_cast<size_t>(slot));
    const int num_layers = static_cast<int>(a.layers.size());
    const int64_t N = static_cast<int64_t>(B) * T, C = shape_.C, Cl = C_local_, F = F_local_, Vl = Vp_local_;
    const int64_t NH = NH_local_, vocab_start = tp_.rank() * Vl;
    const int64_t Nl = sp_ ? N / tp_.size() : N;  // rows of the residual stream held here
    std::byte* w = static_cast<std::byte*>(weights_ptr_);
    const size_t ws = dtype_size(dtype_);
    auto P = [&](int index, std::initializer_list<int64_t> dims) {
        return Tensor(w + static_cast<size_t>(table_[index].offset) * ws, dtype_, dims);
    };
    auto A = [this](void* p, std::initializer_list<int64_t> dims) { return Tensor(p, dtype_, dims); };
    auto S = [](float* p, std::initializer_list<int64_t> dims) { return Tensor::f32(p, dims); };
    Backend& be = backend_;
    // a row-parallel output's partial sums -> this rank's rows of the sum (all rows without sequence parallelism)
    auto reduce_rows = [&](void* partial) {
        if (!sp_) {
            tp_all_reduce(tp_, partial, dtype_, N * C);
            return partial;
        }
        tp_reduce_scatter(tp_, partial, a.sp_local, dtype_, Nl * C);
        return a.sp_local;
    };

    if (part_.embedding) {
        // The host writes a.tokens, which an earlier call's embedding kernels may still read (asynchronous backend).
        be.synchronize();
        for (int64_t n = 0; n < N; ++n) {
            MS_CHECK(tokens[n] >= 0 && tokens[n] < shape_.V, "token {} at {} outside the vocabulary [0, {})", tokens[n],
                     n, shape_.V);
            a.tokens[n] = tokens[n];
        }
        // vocab-parallel embedding: each TP rank adds its rows (zeros elsewhere); the position rows are added once
        Tensor tok(a.tokens, DType::kI32, {N});
        void* partial = sp_ ? a.sp_full : a.encoded;
        be.embedding_forward(
            {tok, P(wte_, {Vl, C}), tp_.rank() == 0 ? P(wpe_, {T, C}) : Tensor(), A(partial, {N, C}), vocab_start, T});
        if (sp_) {
            tp_reduce_scatter(tp_, partial, a.encoded, dtype_, Nl * C);
        } else {
            tp_all_reduce(tp_, a.encoded, dtype_, N * C);
        }
    }

    // Each residual add is fused into the LayerNorm that reads its sum (one op, bit-identical to the two, backend.h):
    // the attention's into ln_2, the MLP's into the next layer's ln_1 or ln_f. Until then the MLP's add is pending:
    // res_out = res_a + (block_out + bias). A stage that ends after a layer (no head) adds it with a residual op.
    struct PendingResidual {
        const void* res_a;
        const void* block_out;  // the attention or MLP output, reduced over tp
        int bias;               // parameter index of c_proj's bias
        void* res_out;
    };
    std::optional<PendingResidual> pending;
    // LayerNorm of the stream `res` (weight at parameter w, bias at w + 1), with the pending add in front if any.
    auto layernorm = [&](const void* res, int w, void* out, float* mean, float* rstd) {
        LayerNormForwardArgs ln{.inp = A(const_cast<void*>(res), {Nl, C}),
                                .weight = P(w, {C}),
                                .bias = P(w + 1, {C}),
                                .out = A(out, {Nl, C}),
                                .mean = S(mean, {Nl}),
                                .rstd = S(rstd, {Nl}),
                                .eps = shape_.eps};
        if (pending) {
            MS_CHECK(pending->res_out == res, "the pending residual add does not write the stream LayerNorm reads");
            ln.inp = Tensor();
            ln.residual_a = A(const_cast<void*>(pending->res_a), {Nl, C});
            ln.residual_b = A(const_cast<void*>(pending->block_out), {Nl, C});
            ln.residual_bias = P(pending->bias, {C});
            ln.residual_out = A(pending->res_out, {Nl, C});
            pending.reset();
        }
        be.layernorm_forward(ln);
    };

    const void* res = a.encoded;
    for (int l = 0; l < num_layers; ++l) {
        auto& x = a.layers[l];
        const int lp = first_layer_param_ + l * kParamsPerLayer;
        void* ln_out = sp_ ? a.sp_local : x.ln1;
        layernorm(res, lp + 0, ln_out, x.ln1_mean, x.ln1_rstd);  // with layer l - 1's MLP add
        if (sp_) tp_all_gather(tp_, ln_out, x.ln1, dtype_, Nl * C);
        be.matmul_forward({A(x.ln1, {N, C}), P(lp + 2, {3 * Cl, C}), P(lp + 3, {3 * Cl}), A(x.qkv, {N, 3 * Cl})});
        be.attention_forward({A(x.qkv, {B, T, 3 * Cl}), A(x.atty, {B, T, Cl}), S(x.lse, {B, NH, T}), NH});
        // row-parallel projection: partial sums, all-reduced, then the bias inside the residual add
        be.matmul_forward({A(x.atty, {N, Cl}), P(lp + 4, {C, Cl}), Tensor(), A(a.proj_out, {N, C})});
        const void* attn_out = reduce_rows(a.proj_out);
        // res2 = res + (attn_out + bias), then ln_2 of res2, one op (ln_out may be attn_out's sp_local: backend.h)
        pending = PendingResidual{res, attn_out, lp + 5, x.res2};
        ln_out = sp_ ? a.sp_local : x.ln2;
        layernorm(x.res2, lp + 6, ln_out, x.ln2_mean, x.ln2_rstd);
        if (sp_) tp_all_gather(tp_, ln_out, x.ln2, dtype_, Nl * C);
        // c_fc and its GELU in one op (cuBLASLt's GELU epilogue on a GPU): fch the pre-activation, kept for backward
        be.matmul_forward(
            {A(x.ln2, {N, C}), P(lp + 8, {F, C}), P(lp + 9, {F}), A(x.fch, {N, F}), A(x.fch_gelu, {N, F})});
        be.matmul_forward({A(x.fch_gelu, {N, F}), P(lp + 10, {C, F}), Tensor(), A(a.proj_out, {N, C})});
        // res3 = res2 + (mlp_out + bias): added by the next LayerNorm
        pending = PendingResidual{x.res2, reduce_rows(a.proj_out), lp + 11, x.res3};
        res = x.res3;
    }
    if (!part_.head) {
        if (pending) {  // the stage's output goes to the next stage, whose first ln_1 reads it
            be.residual_forward({A(const_cast<void*>(pending->res_a), {Nl * C}),
                                 A(const_cast<void*>(pending->block_out), {Nl * C}), A(pending->res_out, {Nl * C}),
                                 P(pending->bias, {C})});
        }
        return std::numeric_limits<float>::quiet_NaN();
    }
    const int ln_f = ln_f_;
    void* lnf_out = sp_ ? a.sp_local : a.lnf;
    layernorm(res, ln_f, lnf_out, a.lnf_mean, a.lnf_rstd);  // with the last layer's MLP add
    if (sp_) tp_all_gather(tp_, lnf_out, a.lnf, dtype_, Nl * C);
    be.matmul_forward({A(a.lnf, {N, C}), P(wte_, {Vl, C}), Tensor(), A(a.logits, {N, Vl})});
    if (!targets) return std::numeric_limits<float>::quiet_NaN();

    be.synchronize();  // as for a.tokens: an earlier call's cross-entropy kernels may still read a.targets
    for (int64_t n = 0; n < N; ++n) {
        MS_CHECK(targets[n] >= 0 && targets[n] < shape_.V, "target {} at {} outside the vocabulary [0, {})", targets[n],
                 n, shape_.V);
        a.targets[n] = targets[n];
    }
    // vocab-parallel cross-entropy: global row max, then global sum-exp and target logit (one all-reduce for both);
    // without tensor parallelism, both in one call (one read of the logits on the GPU)
    const int64_t valid = std::clamp<int64_t>(shape_.V - vocab_start, 0, Vl);
    Tensor tgt(a.targets, DType::kI32, {N});
    float* target_logit = a.sum_exp + N;  // right after this call's N sums, so 2 N elements hold both
    CrossEntropyForwardArgs ce{A(a.logits, {N, Vl}),
                               tgt,
                               S(a.row_max, {N}),
                               S(a.sum_exp, {N}),
                               S(target_logit, {N}),
                               vocab_start,
                               valid,
                               CrossEntropyPhase::kMaxSumExp};
    if (tp_.size() == 1) {
        be.cross_entropy_forward(ce);
    } else {
        ce.phase = CrossEntropyPhase::kMax;
        be.cross_entropy_forward(ce);
        tp_all_reduce(tp_, a.row_max, DType::kF32, N, ReduceOp::kMax);
        ce.phase = CrossEntropyPhase::kSumExp;
        be.cross_entropy_forward(ce);
        tp_all_reduce(tp_, a.sum_exp, DType::kF32, 2 * N);  // sum_exp and target_logit are adjacent
    }

    be.synchronize();  // the host reads the kernels' statistics below
    double total = 0;
    for (int64_t n = 0; n < N; ++n) {
        a.losses[n] = std::log(a.sum_exp[n]) + a.row_max[n] - target_logit[n];
        total += a.losses[n];
    }
    return static_cast<float>(total / static_cast<double>(N));
}

void Gpt::backward(float loss_scale, int slot) {
    MS_CHECK(B_ > 0, "backward() without a forward() with targets");
    Activations& a = *slots_.at(static_cast<size_t>(slot));
    const int num_layers = static_cast<int>(a.layers.size());
    const int B = B_, T = T_;
    const int64_t N = static_cast<int64_t>(B) * T, C = shape_.C, Cl = C_local_, F = F_local_, Vl = Vp_local_;
    const int64_t NH = NH_local_, vocab_start = tp_.rank() * Vl;
    const int64_t Nl = sp_ ? N / tp_.size() : N;
    std::byte* w = static_cast<std::byte*>(weights_ptr_);
    const size_t ws = dtype_size(dtype_);
    float* g = grads();
    auto P = [&](int index, std::initializer_list<int64_t> dims) {
        return Tensor(w + static_cast<size_t>(table_[index].offset) * ws, dtype_, dims);
    };
    auto G = [&](int index, std::initializer_list<int64_t> dims) {
        return Tensor::f32(g + table_[index].offset, dims);
    };
    auto A = [this](void* p, std::initializer_list<int64_t> dims) { return Tensor(p, dtype_, dims); };
    auto S = [](float* p, std::initializer_list<int64_t> dims) { return Tensor::f32(p, dims); };
    Backend& be = backend_;
    // see forward(): partial sums of all rows -> this rank's rows; and this rank's rows -> all rows
    auto reduce_rows = [&](void* partial) {
        if (!sp_) {
            tp_all_reduce(tp_, partial, dtype_, N * C);
            return partial;
        }
        tp_reduce_scatter(tp_, partial, a.sp_local, dtype_, Nl * C);
        return a.sp_local;
    };
    auto gather_rows = [&](void* local) {
        if (!sp_) return local;
        tp_all_gather(tp_, local, a.sp_full, dtype_, Nl * C);
        return a.sp_full;
    };

    if (part_.head) {
        const int ln_f = ln_f_;
        const float dl = loss_scale / static_cast<float>(N);
        be.synchronize();  // dloss is scratch: the previous call's cross-entropy backward may still read it
        for (int64_t n = 0; n < N; ++n) a.dloss[n] = dl;
        const int64_t valid = std::clamp<int64_t>(shape_.V - vocab_start, 0, Vl);
        Tensor tgt(a.targets, DType::kI32, {N});
        be.cross_entropy_backward(
            {A(a.logits, {N, Vl}), tgt, S(a.row_max, {N}), S(a.sum_exp, {N}), S(a.dloss, {N}), vocab_start, valid});
        const void* res_last = num_layers > 0 ? a.layers.back().res3 : a.encoded;
        // the head is column-parallel over the vocabulary: its input gradient is a partial sum
        be.matmul_backward({A(a.logits, {N, Vl}), A(a.lnf, {N, C}), P(wte_, {Vl, C}), A(a.dln, {N, C}),
                            G(wte_, {Vl, C}), Tensor(), Accumulate::kOverwrite});
        void* dln = reduce_rows(a.dln);
        be.layernorm_backward({A(dln, {Nl, C}), A(const_cast<void*>(res_last), {Nl, C}), P(ln_f, {C}),
                               S(a.lnf_mean, {Nl}), S(a.lnf_rstd, {Nl}), A(a.dres, {Nl, C}), G(ln_f, {C}),
                               G(ln_f + 1, {C}), Accumulate::kOverwrite});
    } else {
        be.synchronize();  // dres is scratch that the previous call's kernels may still use
        std::memcpy(a.dres, a.dout, static_cast<size_t>(Nl * C) * ws);
    }

    for (int l = num_layers - 1; l >= 0; --l) {
        auto& x = a.layers[l];
        const void* res_in = l == 0 ? a.encoded : a.layers[l - 1].res3;
        const int lp = first_layer_param_ + l * kParamsPerLayer;
        // MLP: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2)))) + bias; c_proj's input gradient through the GELU in the
        // same op: dfch = gelu'(fch) * (dres @ W_proj)
        be.matmul_backward({A(gather_rows(a.dres), {N, C}), A(x.fch_gelu, {N, F}), P(lp + 10, {C, F}),
                            A(x.dfch, {N, F}), G(lp + 10, {C, F}), G(lp + 11, {C}), Accumulate::kOverwrite,
                            A(x.fch, {N, F})});
        be.matmul_backward({A(x.dfch, {N, F}), A(x.ln2, {N, C}), P(lp + 8, {F, C}), A(a.dln, {N, C}), G(lp + 8, {F, C}),
                            G(lp + 9, {F}), Accumulate::kOverwrite});
        void* dln = reduce_rows(a.dln);
        be.layernorm_backward({A(dln, {Nl, C}), A(x.res2, {Nl, C}), P(lp + 6, {C}), S(x.ln2_mean, {Nl}),
                               S(x.ln2_rstd, {Nl}), A(a.dres, {Nl, C}), G(lp + 6, {C}), G(lp + 7, {C}),
                               Accumulate::kAdd});
        // attention: res2 = res_in + c_proj(attn(c_attn(ln_1(res_in)))) + bias
        be.matmul_backward({A(gather_rows(a.dres), {N, C}), A(x.atty, {N, Cl}), P(lp + 4, {C, Cl}), A(x.datty, {N, Cl}),
                            G(lp + 4, {C, Cl}), G(lp + 5, {C}), Accumulate::kOverwrite});
        be.attention_backward({A(x.datty, {B, T, Cl}), A(x.qkv, {B, T, 3 * Cl}), A(x.atty, {B, T, Cl}),
                               S(x.lse, {B, NH, T}), A(x.dqkv, {B, T, 3 * Cl}), NH});
        be.matmul_backward({A(x.dqkv, {N, 3 * Cl}), A(x.ln1, {N, C}), P(lp + 2, {3 * Cl, C}), A(a.dln, {N, C}),
                            G(lp + 2, {3 * Cl, C}), G(lp + 3, {3 * Cl}), Accumulate::kOverwrite});
        dln = reduce_rows(a.dln);
        be.layernorm_backward({A(dln, {Nl, C}), A(const_cast<void*>(res_in), {Nl, C}), P(lp + 0, {C}),
                               S(x.ln1_mean, {Nl}), S(x.ln1_rstd, {Nl}), A(a.dres, {Nl, C}), G(lp + 0, {C}),
                               G(lp + 1, {C}), Accumulate::kAdd});
    }
    if (part_.embedding) {
        be.embedding_backward({Tensor(a.tokens, DType::kI32, {N}), A(gather_rows(a.dres), {N, C}), G(wte_, {Vl, C}),
                               G(wpe_, {T, C}), vocab_start, T});
    } else {
        be.synchronize();  // the host reads dres, written by the kernels above
        std::memcpy(a.dinp, a.dres, static_cast<size_t>(Nl * C) * ws);
    }
}

void Gpt::finish_gradients() {
    if (!sp_) return;
    // Each TP rank's LayerNorm gradients cover only its rows: sum them (Megatron's sequence-parallel all-reduce).
    for (int i : layernorm_params_) tp_all_reduce(tp_, grads() + table_[i].offset, DType::kF32, table_[i].numel);
}

}  // namespace ms
