// gpt.cpp: GPT-2 forward and backward over the Backend interface (layouts and contracts in gpt.h, backend.h).
#include "engine/model/gpt.h"

#include <cmath>
#include <limits>

#include "engine/core/philox.h"

namespace ms {
namespace {

// Parameters start on 64-byte boundaries so the fused elementwise passes vectorise cleanly.
constexpr int64_t kParamAlign = 16;

int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// Positions in gpt_param_table(): wte, wpe, then kParamsPerLayer entries per layer in the order the table adds
// them (ln_1.{weight,bias}, attn.c_attn.{weight,bias}, attn.c_proj.{weight,bias}, ln_2.{weight,bias},
// mlp.c_fc.{weight,bias}, mlp.c_proj.{weight,bias}), then ln_f.{weight,bias}.
constexpr int kWte = 0;
constexpr int kWpe = 1;
constexpr int kFirstLayerParam = 2;
constexpr int kParamsPerLayer = 12;

}  // namespace

std::vector<ParamInfo> gpt_param_table(const GptShape& s, float init_std) {
    std::vector<ParamInfo> t;
    int64_t offset = 0;
    const float proj_std = init_std / std::sqrt(2.0f * static_cast<float>(s.L));
    auto add = [&](std::string name, std::vector<int64_t> shape, float std_, float value) {
        ParamInfo p;
        p.name = std::move(name);
        p.numel = 1;
        for (int64_t d : shape) p.numel *= d;
        p.shape = std::move(shape);
        p.offset = offset;
        p.weight_decay = p.shape.size() >= 2;
        p.init_std = std_;
        p.init_value = value;
        offset = align_up(offset + p.numel, kParamAlign);
        t.push_back(std::move(p));
    };
    const int64_t C = s.C, F = s.F;
    add("wte.weight", {s.Vp, C}, init_std, 0);
    add("wpe.weight", {s.T, C}, init_std, 0);
    for (int l = 0; l < s.L; ++l) {
        const std::string h = "h." + std::to_string(l) + ".";
        add(h + "ln_1.weight", {C}, 0, 1);
        add(h + "ln_1.bias", {C}, 0, 0);
        add(h + "attn.c_attn.weight", {3 * C, C}, init_std, 0);
        add(h + "attn.c_attn.bias", {3 * C}, 0, 0);
        add(h + "attn.c_proj.weight", {C, C}, proj_std, 0);
        add(h + "attn.c_proj.bias", {C}, 0, 0);
        add(h + "ln_2.weight", {C}, 0, 1);
        add(h + "ln_2.bias", {C}, 0, 0);
        add(h + "mlp.c_fc.weight", {F, C}, init_std, 0);
        add(h + "mlp.c_fc.bias", {F}, 0, 0);
        add(h + "mlp.c_proj.weight", {C, F}, proj_std, 0);
        add(h + "mlp.c_proj.bias", {C}, 0, 0);
    }
    add("ln_f.weight", {C}, 0, 1);
    add("ln_f.bias", {C}, 0, 0);
    return t;
}

int64_t gpt_num_params(const GptShape& s) {
    int64_t n = 0;
    for (const ParamInfo& p : gpt_param_table(s, 0.02f)) n += p.numel;
    return n;
}

double gpt_train_flops_per_token(const GptShape& s, int seq_length) {
    // Megatron's num_floating_point_operations for a dense GPT (forward + backward = 3x forward), per token:
    // 72 L C^2 (1 + T/(6C) + Vp/(12 L C)) with ffn = 4C; written out for a general ffn size.
    const double L = s.L, C = s.C, T = seq_length, F = s.F, Vp = s.Vp;
    const double per_layer = 2.0 * (3 * C * C + C * C + 2 * C * F) + 2.0 * 2.0 * T * C;  // GEMMs + QK^T, PV
    return 3.0 * (L * per_layer + 2.0 * C * Vp);
}

// Everything one forward/backward needs besides parameters and gradients; sized for max_batch * T rows.
struct Gpt::Activations {
    struct Layer {
        float* ln1;       // (N, C)
        float* ln1_mean;  // (N)
        float* ln1_rstd;  // (N)
        float* qkv;       // (N, 3C)
        float* atty;      // (N, C)
        float* lse;       // (B, NH, T)
        float* res2;      // (N, C) residual after attention
        float* ln2;       // (N, C)
        float* ln2_mean;  // (N)
        float* ln2_rstd;  // (N)
        float* fch;       // (N, F) pre-GELU
        float* fch_gelu;  // (N, F)
        float* res3;      // (N, C) residual after the MLP = the layer's output
    };
    HostBuffer storage;
    std::vector<Layer> layers;
    float* encoded;       // (N, C)
    float* lnf;           // (N, C)
    float* lnf_mean;      // (N)
    float* lnf_rstd;      // (N)
    float* logits;        // (N, Vp), dlogits after backward
    float* losses;        // (N)
    float* row_max;       // (N)
    float* sum_exp;       // (N)
    float* target_logit;  // (N)
    float* dloss;         // (N)
    int32_t* tokens;      // (N) inputs of the last forward (the embedding backward needs them)
    int32_t* targets;     // (N)
    // backward scratch, shared by all layers
    float* proj_out;  // (N, C) c_proj outputs before the residual add (forward scratch)
    float* dres;      // (N, C) gradient of the residual stream
    float* dln;       // (N, C)
    float* datty;     // (N, C)
    float* dqkv;      // (N, 3C)
    float* dfch;      // (N, F)
};

Gpt::Gpt(const GptShape& shape, Backend& backend, int max_batch)
    : shape_(shape), backend_(backend), max_batch_(max_batch) {
    MS_CHECK(shape.C % shape.NH == 0, "hidden {} not divisible by heads {}", shape.C, shape.NH);
    MS_CHECK(shape.Vp >= shape.V, "padded vocab {} < vocab {}", shape.Vp, shape.V);
    table_ = gpt_param_table(shape_, 0.02f);
    num_params_ = 0;
    for (const ParamInfo& p : table_) num_params_ += p.numel;
    const int64_t flat = table_.back().offset + table_.back().numel;
    params_ = HostBuffer(static_cast<size_t>(flat) * sizeof(float));
    grads_ = HostBuffer(static_cast<size_t>(flat) * sizeof(float));

    const int64_t N = static_cast<int64_t>(max_batch) * shape.T, C = shape.C, F = shape.F;
    const int64_t per_layer = align_up(N * C, kParamAlign) * 6 + align_up(N * 3 * C, kParamAlign) +
                              align_up(N * F, kParamAlign) * 2 + align_up(N, kParamAlign) * 4 +
                              align_up(N * shape.NH, kParamAlign);
    const int64_t global = align_up(N * C, kParamAlign) * 7 + align_up(N * 3 * C, kParamAlign) +
                           align_up(N * F, kParamAlign) + align_up(N * shape.Vp, kParamAlign) +
                           align_up(N, kParamAlign) * 10;
    acts_ = std::make_unique<Activations>();
    Activations& a = *acts_;
    a.storage = HostBuffer(static_cast<size_t>(per_layer * shape.L + global) * sizeof(float));
    float* cursor = a.storage.as<float>();
    auto take = [&](int64_t n) {
        float* p = cursor;
        cursor += align_up(n, kParamAlign);
        return p;
    };
    a.layers.resize(shape.L);
    for (auto& l : a.layers) {
        l.ln1 = take(N * C);
        l.ln1_mean = take(N);
        l.ln1_rstd = take(N);
        l.qkv = take(N * 3 * C);
        l.atty = take(N * C);
        l.lse = take(N * shape.NH);
        l.res2 = take(N * C);
        l.ln2 = take(N * C);
        l.ln2_mean = take(N);
        l.ln2_rstd = take(N);
        l.fch = take(N * F);
        l.fch_gelu = take(N * F);
        l.res3 = take(N * C);
    }
    a.encoded = take(N * C);
    a.lnf = take(N * C);
    a.lnf_mean = take(N);
    a.lnf_rstd = take(N);
    a.logits = take(N * shape.Vp);
    a.losses = take(N);
    a.row_max = take(N);
    a.sum_exp = take(N);
    a.target_logit = take(N);
    a.dloss = take(N);
    a.tokens = reinterpret_cast<int32_t*>(take(N));
    a.targets = reinterpret_cast<int32_t*>(take(N));
    a.proj_out = take(N * C);
    a.dres = take(N * C);
    a.dln = take(N * C);
    a.datty = take(N * C);
    a.dqkv = take(N * 3 * C);
    a.dfch = take(N * F);
    MS_CHECK(cursor <= a.storage.as<float>() + a.storage.size() / sizeof(float), "activation plan overflow");
}

Gpt::~Gpt() = default;

const ParamInfo& Gpt::param(const std::string& name) const {
    for (const ParamInfo& p : table_)
        if (p.name == name) return p;
    MS_UNREACHABLE("no parameter named '{}'", name);
}

void Gpt::init_weights(uint64_t seed) {
    float* w = params();
    for (const ParamInfo& p : table_) {
        float* dst = w + p.offset;
        if (p.init_std == 0.0f) {
            for (int64_t i = 0; i < p.numel; ++i) dst[i] = p.init_value;
            continue;
        }
        const uint64_t stream = name_hash(p.name);
        // Rows of wte past the real vocabulary are never looked up and their logits are masked: keep them 0.
        const int64_t live = p.name == "wte.weight" ? static_cast<int64_t>(shape_.V) * shape_.C : p.numel;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < p.numel; ++i) dst[i] = i < live ? p.init_std * philox_normal(seed, stream, i) : 0.0f;
    }
}

void Gpt::zero_grads() { backend_.zero(Tensor::f32(grads(), {table_.back().offset + table_.back().numel})); }

const float* Gpt::logits() const { return acts_->logits; }
const float* Gpt::losses() const { return acts_->losses; }

float Gpt::forward(const int32_t* tokens, const int32_t* targets, int B, int T) {
    MS_CHECK(B >= 1 && B <= max_batch_, "batch {} outside [1, {}]", B, max_batch_);
    MS_CHECK(T >= 1 && T <= shape_.T, "sequence length {} outside [1, {}]", T, shape_.T);
    B_ = B;
    T_ = T;
    Activations& a = *acts_;
    const int64_t N = static_cast<int64_t>(B) * T, C = shape_.C, F = shape_.F, Vp = shape_.Vp;
    float* w = params();
    auto P = [&](int index, std::initializer_list<int64_t> dims) {
        return Tensor::f32(w + table_[index].offset, dims);
    };
    auto A = [](float* p, std::initializer_list<int64_t> dims) { return Tensor::f32(p, dims); };
    Backend& be = backend_;
    const int ln_f = kFirstLayerParam + shape_.L * kParamsPerLayer;

    for (int64_t n = 0; n < N; ++n) {
        MS_CHECK(tokens[n] >= 0 && tokens[n] < shape_.V, "token {} at {} outside the vocabulary [0, {})", tokens[n],
                 n, shape_.V);
        a.tokens[n] = tokens[n];
    }
    Tensor tok(a.tokens, DType::kI32, {N});
    be.embedding_forward({tok, P(kWte, {Vp, C}), P(kWpe, {T, C}), A(a.encoded, {N, C}), 0, T});

    const float* res = a.encoded;
    for (int l = 0; l < shape_.L; ++l) {
        auto& x = a.layers[l];
        const int lp = kFirstLayerParam + l * kParamsPerLayer;
        be.layernorm_forward({A(const_cast<float*>(res), {N, C}), P(lp + 0, {C}), P(lp + 1, {C}),
                              A(x.ln1, {N, C}), A(x.ln1_mean, {N}), A(x.ln1_rstd, {N}), shape_.eps});
        be.matmul_forward({A(x.ln1, {N, C}), P(lp + 2, {3 * C, C}), P(lp + 3, {3 * C}),
                           A(x.qkv, {N, 3 * C})});
        be.attention_forward({A(x.qkv, {B, T, 3 * C}), A(x.atty, {B, T, C}), A(x.lse, {B, shape_.NH, T}), shape_.NH});
        be.matmul_forward({A(x.atty, {N, C}), P(lp + 4, {C, C}), P(lp + 5, {C}),
                           A(a.proj_out, {N, C})});
        be.residual_forward({A(const_cast<float*>(res), {N * C}), A(a.proj_out, {N * C}), A(x.res2, {N * C})});
        be.layernorm_forward({A(x.res2, {N, C}), P(lp + 6, {C}), P(lp + 7, {C}), A(x.ln2, {N, C}),
                              A(x.ln2_mean, {N}), A(x.ln2_rstd, {N}), shape_.eps});
        be.matmul_forward({A(x.ln2, {N, C}), P(lp + 8, {F, C}), P(lp + 9, {F}),
                           A(x.fch, {N, F})});
        be.gelu_forward({A(x.fch, {N * F}), A(x.fch_gelu, {N * F})});
        be.matmul_forward({A(x.fch_gelu, {N, F}), P(lp + 10, {C, F}), P(lp + 11, {C}),
                           A(a.proj_out, {N, C})});
        be.residual_forward({A(x.res2, {N * C}), A(a.proj_out, {N * C}), A(x.res3, {N * C})});
        res = x.res3;
    }
    be.layernorm_forward({A(const_cast<float*>(res), {N, C}), P(ln_f, {C}), P(ln_f + 1, {C}),
                          A(a.lnf, {N, C}), A(a.lnf_mean, {N}), A(a.lnf_rstd, {N}), shape_.eps});
    be.matmul_forward({A(a.lnf, {N, C}), P(kWte, {Vp, C}), Tensor(), A(a.logits, {N, Vp})});
    if (!targets) return std::numeric_limits<float>::quiet_NaN();

    for (int64_t n = 0; n < N; ++n) {
        MS_CHECK(targets[n] >= 0 && targets[n] < shape_.V, "target {} at {} outside the vocabulary [0, {})",
                 targets[n], n, shape_.V);
        a.targets[n] = targets[n];
    }
    Tensor tgt(a.targets, DType::kI32, {N});
    CrossEntropyForwardArgs ce{A(a.logits, {N, Vp}),    tgt, A(a.row_max, {N}), A(a.sum_exp, {N}),
                               A(a.target_logit, {N}), 0,   shape_.V,          CrossEntropyPhase::kMax};
    be.cross_entropy_forward(ce);
    ce.phase = CrossEntropyPhase::kSumExp;
    be.cross_entropy_forward(ce);
    double total = 0;
    for (int64_t n = 0; n < N; ++n) {
        a.losses[n] = std::log(a.sum_exp[n]) + a.row_max[n] - a.target_logit[n];
        total += a.losses[n];
    }
    return static_cast<float>(total / static_cast<double>(N));
}

void Gpt::backward(float loss_scale) {
    MS_CHECK(B_ > 0, "backward() without a forward() with targets");
    Activations& a = *acts_;
    const int B = B_, T = T_;
    const int64_t N = static_cast<int64_t>(B) * T, C = shape_.C, F = shape_.F, Vp = shape_.Vp;
    float* w = params();
    float* g = grads();
    auto P = [&](int index, std::initializer_list<int64_t> dims) {
        return Tensor::f32(w + table_[index].offset, dims);
    };
    auto G = [&](int index, std::initializer_list<int64_t> dims) {
        return Tensor::f32(g + table_[index].offset, dims);
    };
    auto A = [](float* p, std::initializer_list<int64_t> dims) { return Tensor::f32(p, dims); };
    Backend& be = backend_;
    const int ln_f = kFirstLayerParam + shape_.L * kParamsPerLayer;

    const float dl = loss_scale / static_cast<float>(N);
    for (int64_t n = 0; n < N; ++n) a.dloss[n] = dl;
    Tensor tgt(a.targets, DType::kI32, {N});
    be.cross_entropy_backward({A(a.logits, {N, Vp}), tgt, A(a.row_max, {N}), A(a.sum_exp, {N}), A(a.dloss, {N}), 0,
                               shape_.V});
    const float* res_last = shape_.L > 0 ? a.layers.back().res3 : a.encoded;
    be.matmul_backward({A(a.logits, {N, Vp}), A(a.lnf, {N, C}), P(kWte, {Vp, C}), A(a.dln, {N, C}),
                        G(kWte, {Vp, C}), Tensor(), Accumulate::kOverwrite});
    be.layernorm_backward({A(a.dln, {N, C}), A(const_cast<float*>(res_last), {N, C}), P(ln_f, {C}),
                           A(a.lnf_mean, {N}), A(a.lnf_rstd, {N}), A(a.dres, {N, C}), G(ln_f, {C}),
                           G(ln_f + 1, {C}), Accumulate::kOverwrite});

    for (int l = shape_.L - 1; l >= 0; --l) {
        auto& x = a.layers[l];
        const float* res_in = l == 0 ? a.encoded : a.layers[l - 1].res3;
        const int lp = kFirstLayerParam + l * kParamsPerLayer;
        // MLP: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2))))
        be.matmul_backward({A(a.dres, {N, C}), A(x.fch_gelu, {N, F}), P(lp + 10, {C, F}),
                            A(a.dfch, {N, F}), G(lp + 10, {C, F}), G(lp + 11, {C}),
                            Accumulate::kOverwrite});
        be.gelu_backward({A(x.fch, {N * F}), A(a.dfch, {N * F}), A(a.dfch, {N * F})});
        be.matmul_backward({A(a.dfch, {N, F}), A(x.ln2, {N, C}), P(lp + 8, {F, C}), A(a.dln, {N, C}),
                            G(lp + 8, {F, C}), G(lp + 9, {F}), Accumulate::kOverwrite});
        be.layernorm_backward({A(a.dln, {N, C}), A(x.res2, {N, C}), P(lp + 6, {C}), A(x.ln2_mean, {N}),
                               A(x.ln2_rstd, {N}), A(a.dres, {N, C}), G(lp + 6, {C}),
                               G(lp + 7, {C}), Accumulate::kAdd});
        // attention: res2 = res_in + c_proj(attn(c_attn(ln_1(res_in))))
        be.matmul_backward({A(a.dres, {N, C}), A(x.atty, {N, C}), P(lp + 4, {C, C}),
                            A(a.datty, {N, C}), G(lp + 4, {C, C}), G(lp + 5, {C}),
                            Accumulate::kOverwrite});
        be.attention_backward({A(a.datty, {B, T, C}), A(x.qkv, {B, T, 3 * C}), A(x.atty, {B, T, C}),
                               A(x.lse, {B, shape_.NH, T}), A(a.dqkv, {B, T, 3 * C}), shape_.NH});
        be.matmul_backward({A(a.dqkv, {N, 3 * C}), A(x.ln1, {N, C}), P(lp + 2, {3 * C, C}),
                            A(a.dln, {N, C}), G(lp + 2, {3 * C, C}),
                            G(lp + 3, {3 * C}), Accumulate::kOverwrite});
        be.layernorm_backward({A(a.dln, {N, C}), A(const_cast<float*>(res_in), {N, C}), P(lp + 0, {C}),
                               A(x.ln1_mean, {N}), A(x.ln1_rstd, {N}), A(a.dres, {N, C}), G(lp + 0, {C}),
                               G(lp + 1, {C}), Accumulate::kAdd});
    }
    be.embedding_backward({Tensor(a.tokens, DType::kI32, {N}), A(a.dres, {N, C}), G(kWte, {Vp, C}),
                           G(kWpe, {T, C}), 0, T});
}

}  // namespace ms
