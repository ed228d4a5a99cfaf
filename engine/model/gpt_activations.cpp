// gpt_activations.cpp: the op sequence of one micro-batch on a Gpt chunk and the plan of its buffers (see
// gpt_activations.h). The ops below follow Gpt::forward and Gpt::backward (engine/model/gpt.cpp) line by line; a
// buffer missing from an op that touches it would let the planner hand its memory to another buffer too early, so
// a change to either function must change its op here too (the model tests then catch a missing buffer: the
// gradients no longer match the reference).
#include "engine/model/gpt_activations.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <initializer_list>

#include "engine/core/check.h"

namespace ms {
namespace {

class Builder {
  public:
    explicit Builder(DType act) : act_size_(dtype_size(act)) {}
    // A buffer of `elems` elements; -1 (touching it is a no-op) when elems == 0, i.e. not held. Activations (and
    // their gradients) are in the activation dtype, statistics, tokens and targets 4-byte fp32 / int32.
    int add(GptBuf id, int layer, GptBufGroup group, int64_t elems) {
        if (elems == 0) return -1;
        auto& requests = group == GptBufGroup::kSlot ? plan_.slot_requests : plan_.scratch_requests;
        const std::string name = layer >= 0 ? fmt::format("h.{}.{}", layer, gpt_buf_name(id)) : gpt_buf_name(id);
        const size_t elem_size = gpt_buf_is_activation(id) ? act_size_ : 4;
        requests.push_back(BufferRequest{name, static_cast<size_t>(elems) * elem_size, INT_MAX, -1, -1});
        plan_.buffers.push_back(GptBuffer{id, layer, group, static_cast<int>(requests.size()) - 1});
        return static_cast<int>(plan_.buffers.size()) - 1;
    }
    // The next op reads or writes these buffers.
    void op(std::initializer_list<int> touched) {
        for (int b : touched) {
            if (b < 0) continue;
            const GptBuffer& buf = plan_.buffers[static_cast<size_t>(b)];
            auto& r = (buf.group == GptBufGroup::kSlot ? plan_.slot_requests
                                                       : plan_.scratch_requests)[static_cast<size_t>(buf.request)];
            r.first_use = std::min(r.first_use, ops_);
            r.last_use = std::max(r.last_use, ops_);
        }
        ++ops_;
    }
    // The buffers with their lifetimes; offsets are left to the caller.
    GptActivationPlan finish() {
        for (const GptBuffer& b : plan_.buffers) {
            const auto& r = (b.group == GptBufGroup::kSlot ? plan_.slot_requests
                                                           : plan_.scratch_requests)[static_cast<size_t>(b.request)];
            MS_CHECK(r.last_use >= 0, "gpt activation plan: buffer '{}' is held but no op touches it", r.name);
        }
        plan_.num_ops = ops_;
        return std::move(plan_);
    }

  private:
    size_t act_size_;
    GptActivationPlan plan_;
    int ops_ = 0;
};

}  // namespace

bool gpt_buf_is_activation(GptBuf buf) {
    switch (buf) {
        case GptBuf::kLn1Mean:
        case GptBuf::kLn1Rstd:
        case GptBuf::kLse:
        case GptBuf::kLn2Mean:
        case GptBuf::kLn2Rstd:
        case GptBuf::kLnfMean:
        case GptBuf::kLnfRstd:
        case GptBuf::kLosses:
        case GptBuf::kRowMax:
        case GptBuf::kSumExp:
        case GptBuf::kTokens:
        case GptBuf::kTargets:
        case GptBuf::kDloss:
            return false;
        default:
            return true;
    }
}

const char* gpt_buf_name(GptBuf buf) {
    switch (buf) {
        case GptBuf::kLn1:
            return "ln1";
        case GptBuf::kLn1Mean:
            return "ln1_mean";
        case GptBuf::kLn1Rstd:
            return "ln1_rstd";
        case GptBuf::kQkv:
            return "qkv";
        case GptBuf::kAtty:
            return "atty";
        case GptBuf::kLse:
            return "lse";
        case GptBuf::kRes2:
            return "res2";
        case GptBuf::kLn2:
            return "ln2";
        case GptBuf::kLn2Mean:
            return "ln2_mean";
        case GptBuf::kLn2Rstd:
            return "ln2_rstd";
        case GptBuf::kFch:
            return "fch";
        case GptBuf::kFchGelu:
            return "fch_gelu";
        case GptBuf::kRes3:
            return "res3";
        case GptBuf::kDfch:
            return "dfch";
        case GptBuf::kDatty:
            return "datty";
        case GptBuf::kDqkv:
            return "dqkv";
        case GptBuf::kEncoded:
            return "encoded";
        case GptBuf::kLnf:
            return "lnf";
        case GptBuf::kLnfMean:
            return "lnf_mean";
        case GptBuf::kLnfRstd:
            return "lnf_rstd";
        case GptBuf::kLogits:
            return "logits";
        case GptBuf::kLosses:
            return "losses";
        case GptBuf::kRowMax:
            return "row_max";
        case GptBuf::kSumExp:
            return "sum_exp";
        case GptBuf::kTokens:
            return "tokens";
        case GptBuf::kTargets:
            return "targets";
        case GptBuf::kDout:
            return "dout";
        case GptBuf::kDinp:
            return "dinp";
        case GptBuf::kProjOut:
            return "proj_out";
        case GptBuf::kDres:
            return "dres";
        case GptBuf::kDln:
            return "dln";
        case GptBuf::kDloss:
            return "dloss";
        case GptBuf::kSpLocal:
            return "sp_local";
        case GptBuf::kSpFull:
            return "sp_full";
    }
    MS_UNREACHABLE("GptBuf {}", static_cast<int>(buf));
}

namespace {

int part_layers(const GptShape& s, const GptPart& part) {
    return part.num_layers < 0 ? s.L - part.first_layer : part.num_layers;
}

// The op sequence of one micro-batch on the chunk, walked over its first `walked` layers: every buffer with its
// lifetime, no offsets yet. walked = all layers gives exact lifetimes; walked = 1 stands for all of them
// (gpt_activations.h).
GptActivationPlan walk_ops(const GptShape& s, const GptPart& part, int tp, int max_batch, bool sequence_parallel,
                           DType act, int walked) {
    MS_CHECK(tp >= 1 && s.NH % tp == 0 && s.F % tp == 0 && s.Vp % tp == 0, "tp {} does not divide NH {}, F {}, Vp {}",
             tp, s.NH, s.F, s.Vp);
    const bool sp = sequence_parallel && tp > 1;
    const int64_t N = static_cast<int64_t>(max_batch) * s.seq(), C = s.C;
    const int64_t Nl = sp ? N / tp : N;  // rows of the residual stream held here
    const int64_t NHl = s.NH / tp, Cl = NHl * (s.C / s.NH), Fl = s.F / tp, Vl = s.Vp / tp;
    const int layers = walked;
    const bool emb = part.embedding, head = part.head;
    constexpr GptBufGroup kSlot = GptBufGroup::kSlot, kScratch = GptBufGroup::kScratch;

    MS_CHECK(is_float(act), "activation dtype {} is not fp32, bf16 or fp16", dtype_name(act));
    Builder b(act);
    struct Layer {
        int ln1, ln1_mean, ln1_rstd, qkv, atty, lse, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, res3;
        int dfch, datty, dqkv;
    };
    std::vector<Layer> L(static_cast<size_t>(layers));
    for (int l = 0; l < layers; ++l) {
        Layer& x = L[static_cast<size_t>(l)];
        x.ln1 = b.add(GptBuf::kLn1, l, kSlot, N * C);
        x.ln1_mean = b.add(GptBuf::kLn1Mean, l, kSlot, Nl);
        x.ln1_rstd = b.add(GptBuf::kLn1Rstd, l, kSlot, Nl);
        x.qkv = b.add(GptBuf::kQkv, l, kSlot, N * 3 * Cl);
        x.atty = b.add(GptBuf::kAtty, l, kSlot, N * Cl);
        x.lse = b.add(GptBuf::kLse, l, kSlot, N * NHl);
        x.res2 = b.add(GptBuf::kRes2, l, kSlot, Nl * C);
        x.ln2 = b.add(GptBuf::kLn2, l, kSlot, N * C);
        x.ln2_mean = b.add(GptBuf::kLn2Mean, l, kSlot, Nl);
        x.ln2_rstd = b.add(GptBuf::kLn2Rstd, l, kSlot, Nl);
        x.fch = b.add(GptBuf::kFch, l, kSlot, N * Fl);
        x.fch_gelu = b.add(GptBuf::kFchGelu, l, kSlot, N * Fl);
        x.res3 = b.add(GptBuf::kRes3, l, kSlot, Nl * C);
        x.dfch = b.add(GptBuf::kDfch, l, kScratch, N * Fl);
        x.datty = b.add(GptBuf::kDatty, l, kScratch, N * Cl);
        x.dqkv = b.add(GptBuf::kDqkv, l, kScratch, N * 3 * Cl);
    }
    const int encoded = b.add(GptBuf::kEncoded, -1, kSlot, Nl * C);
    const int lnf = b.add(GptBuf::kLnf, -1, kSlot, head ? N * C : 0);
    const int lnf_mean = b.add(GptBuf::kLnfMean, -1, kSlot, head ? Nl : 0);
    const int lnf_rstd = b.add(GptBuf::kLnfRstd, -1, kSlot, head ? Nl : 0);
    const int logits = b.add(GptBuf::kLogits, -1, kSlot, head ? N * Vl : 0);
    const int losses = b.add(GptBuf::kLosses, -1, kSlot, head ? N : 0);
    const int row_max = b.add(GptBuf::kRowMax, -1, kSlot, head ? N : 0);
    const int sum_exp = b.add(GptBuf::kSumExp, -1, kSlot, head ? 2 * N : 0);  // and target_logit
    const int tokens = b.add(GptBuf::kTokens, -1, kSlot, emb ? N : 0);
    const int targets = b.add(GptBuf::kTargets, -1, kSlot, head ? N : 0);
    const int dout = b.add(GptBuf::kDout, -1, kSlot, head ? 0 : Nl * C);
    const int dinp = b.add(GptBuf::kDinp, -1, kSlot, emb ? 0 : Nl * C);
    const int proj_out = b.add(GptBuf::kProjOut, -1, kScratch, N * C);
    const int dres = b.add(GptBuf::kDres, -1, kScratch, Nl * C);
    const int dln = b.add(GptBuf::kDln, -1, kScratch, N * C);
    const int dloss = b.add(GptBuf::kDloss, -1, kScratch, head ? N : 0);
    const int sp_local = b.add(GptBuf::kSpLocal, -1, kScratch, sp ? Nl * C : 0);
    const int sp_full = b.add(GptBuf::kSpFull, -1, kScratch, sp ? N * C : 0);

    // forward
    b.op({tokens, encoded, sp_full});  // embedding (partial sums in sp_full under sp), or the received input
    // Each residual add is fused into the LayerNorm that reads its sum; the MLP's (res3 = res2 + mlp_out) into the
    // next layer's ln_1 or ln_f, so that op also touches the previous layer's res2 and proj_out (sp_local).
    int res = encoded;
    int res_a = -1, mlp_out = -1;  // the previous layer's res2 and MLP output while its residual add is pending
    for (const Layer& x : L) {
        // (residual +) ln_1, into sp_local and all-gathered into ln1
        b.op({res_a, mlp_out, res, x.ln1_mean, x.ln1_rstd, sp_local, x.ln1});
        b.op({x.ln1, x.qkv});                                                    // c_attn
        b.op({x.qkv, x.atty, x.lse});                                            // attention
        b.op({x.atty, proj_out, sp_local});                                      // attn.c_proj, reduced over tp
        b.op({res, proj_out, sp_local, x.res2, x.ln2_mean, x.ln2_rstd, x.ln2});  // residual + ln_2
        b.op({x.ln2, x.fch, x.fch_gelu});                                        // c_fc and its gelu (one op)
        b.op({x.fch_gelu, proj_out, sp_local});                                  // mlp.c_proj, reduced over tp
        res_a = x.res2;
        mlp_out = proj_out;
        res = x.res3;
    }
    const int output = res;
    if (head) {
        b.op({res_a, mlp_out, res, lnf_mean, lnf_rstd, sp_local, lnf});  // (residual +) ln_f
        b.op({lnf, logits});                                             // lm head
        b.op({logits, targets, row_max, sum_exp, losses});               // cross-entropy
    } else {
        b.op({res_a, mlp_out, sp_local, output});  // the last layer's residual add
        b.op({output, dout});                      // the output is copied into a send buffer, its gradient received
    }

    // backward
    if (head) {
        b.op({dloss, logits, targets, row_max, sum_exp});      // cross-entropy: dlogits over logits
        b.op({logits, lnf, dln});                              // lm head
        b.op({dln, sp_local, res, lnf_mean, lnf_rstd, dres});  // ln_f
    } else {
        b.op({dout, dres});
    }
    for (int l = layers - 1; l >= 0; --l) {
        const Layer& x = L[static_cast<size_t>(l)];
        const int res_in = l == 0 ? encoded : L[static_cast<size_t>(l) - 1].res3;
        b.op({dres, sp_full, x.fch_gelu, x.fch, x.dfch});             // mlp.c_proj and the gelu (dres all-gathered)
        b.op({x.dfch, x.ln2, dln});                                   // c_fc
        b.op({dln, sp_local, x.res2, x.ln2_mean, x.ln2_rstd, dres});  // ln_2 (dln reduced)
        b.op({dres, sp_full, x.atty, x.datty});                       // attn.c_proj
        b.op({x.datty, x.qkv, x.atty, x.lse, x.dqkv});                // attention
        b.op({x.dqkv, x.ln1, dln});                                   // c_attn
        b.op({dln, sp_local, res_in, x.ln1_mean, x.ln1_rstd, dres});  // ln_1
    }
    if (emb) {
        b.op({tokens, dres, sp_full});  // embedding
    } else {
        b.op({dres, dinp});
    }
    // after backward() returns: the pipeline copies dinp into a send buffer; losses() reads losses
    b.op({dinp, losses});
    return b.finish();
}

const BufferRequest& request_of(const GptActivationPlan& p, const GptBuffer& b) {
    return (b.group == GptBufGroup::kSlot ? p.slot_requests : p.scratch_requests)[static_cast<size_t>(b.request)];
}

constexpr size_t kNumGptBufs = static_cast<size_t>(GptBuf::kSpFull) + 1;

}  // namespace

size_t GptActivationLayout::offset(const GptBuffer& buf) const {
    const size_t r = static_cast<size_t>(request_of[static_cast<size_t>(buf.id)]);
    if (buf.layer < 0) return (buf.group == GptBufGroup::kSlot ? slot : scratch).offsets[r];
    if (buf.group == GptBufGroup::kSlot) {
        return slot.offsets[static_cast<size_t>(layers_request)] +
               static_cast<size_t>(buf.layer) * layer_slot.total_bytes + layer_slot.offsets[r];
    }
    return scratch.offsets[static_cast<size_t>(layer_scratch_request)] + layer_scratch.offsets[r];
}

GptActivationLayout plan_gpt_activation_layout(const GptShape& s, const GptPart& part, int tp, int max_batch,
                                               bool sequence_parallel, DType act) {
    GptActivationLayout out;
    out.layers = part_layers(s, part);
    const GptActivationPlan walk = walk_ops(s, part, tp, max_batch, sequence_parallel, act, std::min(out.layers, 1));
    out.request_of.assign(kNumGptBufs, -1);
    BufferRequest layers{"layers", 0, INT_MAX, -1, -1}, layer_scratch{"layer_scratch", 0, INT_MAX, -1, -1};
    for (const GptBuffer& b : walk.buffers) {
        const BufferRequest& r = request_of(walk, b);
        const bool slot = b.group == GptBufGroup::kSlot;
        std::vector<BufferRequest>& level = b.layer < 0 ? (slot ? out.slot_requests : out.scratch_requests)
                                                        : (slot ? out.layer_slot_requests : out.layer_scratch_requests);
        out.request_of[static_cast<size_t>(b.id)] = static_cast<int>(level.size());
        level.push_back(r);
        if (b.layer < 0) continue;
        BufferRequest& block = slot ? layers : layer_scratch;
        block.first_use = std::min(block.first_use, r.first_use);
        block.last_use = std::max(block.last_use, r.last_use);
    }
    out.layer_slot = plan_buffers(out.layer_slot_requests, kGptActivationAlign);
    out.layer_scratch = plan_buffers(out.layer_scratch_requests, kGptActivationAlign);
    if (out.layers > 0) {
        layers.bytes = static_cast<size_t>(out.layers) * out.layer_slot.total_bytes;
        layer_scratch.bytes = out.layer_scratch.total_bytes;
        out.layers_request = static_cast<int>(out.slot_requests.size());
        out.slot_requests.push_back(layers);
        out.layer_scratch_request = static_cast<int>(out.scratch_requests.size());
        out.scratch_requests.push_back(layer_scratch);
    }
    out.slot = plan_buffers(out.slot_requests, kGptActivationAlign);
    out.scratch = plan_buffers(out.scratch_requests, kGptActivationAlign);
    return out;
}

GptActivationPlan plan_gpt_activations(const GptShape& s, const GptPart& part, int tp, int max_batch,
                                       bool sequence_parallel, DType act) {
    const GptActivationLayout layout = plan_gpt_activation_layout(s, part, tp, max_batch, sequence_parallel, act);
    GptActivationPlan plan = walk_ops(s, part, tp, max_batch, sequence_parallel, act, layout.layers);
    plan.slot.offsets.resize(plan.slot_requests.size());
    plan.scratch.offsets.resize(plan.scratch_requests.size());
    for (const GptBuffer& b : plan.buffers) {
        (b.group == GptBufGroup::kSlot ? plan.slot : plan.scratch).offsets[static_cast<size_t>(b.request)] =
            layout.offset(b);
    }
    plan.slot.total_bytes = layout.slot.total_bytes;
    plan.scratch.total_bytes = layout.scratch.total_bytes;
    plan.slot.peak_live_bytes = peak_live_bytes(plan.slot_requests);
    plan.scratch.peak_live_bytes = peak_live_bytes(plan.scratch_requests);
    return plan;
}

}  // namespace ms
