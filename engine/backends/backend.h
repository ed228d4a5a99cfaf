// backend.h: the op interface every device implements (CPU now, CUDA later), one method per op family.
//
// Dimensions: B batch, T sequence, C hidden, NH heads, HS = C/NH head size, V vocab (real), Vp padded vocab,
// N = B*T rows. TP-local sizes end in _local. All tensors are contiguous row-major views (engine/core/tensor.h)
// whose storage belongs to the caller. Weights are in Linear orientation: (out_features, in_features).
//
// Accumulation contract (the same for every backend):
//   - parameter gradients (dweight, dbias, dtable, dpos) are ACCUMULATED (+=): gradient accumulation over
//     micro-batches needs no extra buffers and the trainer zeroes them once per step;
//   - activation gradients (dinp) follow the `Accumulate` field of their op: kOverwrite (=) or kAdd (+=).
//     kAdd is used where an activation feeds two consumers (the residual stream).
// Every op is deterministic: the same inputs give bit-identical outputs on the same machine and thread count.
//
// Precision contract (mixed precision, docs/design.md §6). An op computes on one "activation dtype" D, fp32, bf16 or
// fp16 (engine/core/half.h), taken from its activation tensors:
//   - activations and their gradients (inp, out, dout, dinp, qkv, logits/dlogits, a, b) and the model weights an op
//     reads (weight, bias, table, pos) are D;
//   - parameter gradients (dweight, dbias, dtable, dpos, dwte) are fp32 (Megatron's main_grad, accumulated over
//     micro-batches in fp32: grad_reduce_in_fp32, the default) or D (grad_reduce_in_fp32: false, bf16 / fp16 runs);
//     an op takes their dtype from the tensor. A D gradient is updated by rounding, once per call, the fp32 sum of its
//     old value and the op's whole fp32 contribution (lm_head_loss: once per chunk of rows, the chunk's contribution
//     being what an fp32 dwte would get added), so a D gradient equals from_float<D>(old + the fp32 contribution)
//     element by element, and an fp32 gradient is what it always was;
//   - statistics (mean, rstd, lse, row_max, sum_exp, target_logit, dloss) and the optimizer's tensors (AdamWArgs)
//     are always fp32;
//   - values are loaded as fp32 (to_float), every sum and product is fp32, and each D output element is rounded
//     once, on store (from_float<D>: round-to-nearest-even). kAdd on a D output rounds the fp32 sum of the old value
//     and the new term. A GEMM rounds its fp32 accumulator (plus the bias) once.
// So for D = fp32 nothing changes, and a CPU and a CUDA op on the same D inputs differ only by summation order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "engine/core/tensor.h"

namespace ms {

class ArenaMemory;  // memory/arena_memory.h

enum class Accumulate : uint8_t { kOverwrite, kAdd };

enum class OpKind : uint16_t {
    kEmbeddingForward,
    kEmbeddingBackward,
    kLayerNormForward,
    kLayerNormBackward,
    kMatmulForward,
    kMatmulBackward,
    kAttentionForward,
    kAttentionBackward,
    kGeluForward,
    kGeluBackward,
    kResidualForward,
    kLayerNormResidualForward,  // layernorm_forward with residual_out defined (the residual add fused in front)
    kCrossEntropyForward,
    kCrossEntropyBackward,
    kLmHeadLoss,  // matmul + cross-entropy (forward and backward) of the LM head, chunk by chunk over the rows
    kAdamW,
    kSumSquares,
    kCast,
    kRmsNormForward,
    kRmsNormBackward,
    kRope,  // forward and inverse rotation (RopeDirection)
    kSwiGluForward,
    kSwiGluBackward,
    kAttentionBlockForward,  // context parallelism's ring attention: one key/value block, merged by log-sum-exp
    kAttentionBlockBackward,
    kCopyColumns,
    kCount
};

// out[n] = (vocab_start <= tok[n] < vocab_start + V_local ? table[tok[n] - vocab_start] : 0) + (pos ? pos[n % T] : 0)
struct EmbeddingForwardArgs {
    Tensor tokens;        // (N) int32, token ids in [0, V)
    Tensor table;         // (V_local, C) this rank's rows of the (padded) token embedding
    Tensor pos;           // (T, C) position embedding (optional: undefined skips the add)
    Tensor out;           // (N, C)
    int64_t vocab_start;  // first global row held in `table`
    int64_t T;            // position of row n is n % T
};
struct EmbeddingBackwardArgs {
    Tensor tokens;  // (N) int32
    Tensor dout;    // (N, C)
    Tensor dtable;  // (V_local, C) += (rows outside this rank's range are not touched)
    Tensor dpos;    // (T, C) += (optional)
    int64_t vocab_start;
    int64_t T;
};

// out = (inp - mean) * rstd * weight + bias over the last dim; mean/rstd saved for the backward.
//
// Residual fusion (the residual stream's add and the LayerNorm that reads its result, one op): with residual_out
// defined, inp must be undefined, and the op first writes residual_out = residual_a + (residual_b + residual_bias)
// exactly as ResidualForwardArgs defines it (residual_bias optional), then normalises residual_out as its input.
// Each sum is rounded once to D on store and the LayerNorm reads the rounded value, so the fused op is bit-identical
// to residual_forward followed by layernorm_forward on every backend and dtype (the tests compare with ==); its
// backward is layernorm_backward with inp = residual_out. residual_out may alias residual_a, and out may alias
// residual_b (every row's inputs are read before that row's outputs are written).
struct LayerNormForwardArgs {
    Tensor inp;     // (N, C) (undefined when residual_out is defined)
    Tensor weight;  // (C)
    Tensor bias;    // (C)
    Tensor out;     // (N, C)
    Tensor mean;    // (N) fp32
    Tensor rstd;    // (N) fp32
    float eps;
    Tensor residual_a = {};     // (N, C) the residual stream (only with residual_out)
    Tensor residual_b = {};     // (N, C) the block's output added to it (only with residual_out)
    Tensor residual_bias = {};  // (C) added to residual_b as in ResidualForwardArgs (optional)
    Tensor residual_out = {};   // (N, C) = residual_a + (residual_b + residual_bias), then normalised (optional)
};
struct LayerNormBackwardArgs {
    Tensor dout;     // (N, C)
    Tensor inp;      // (N, C)
    Tensor weight;   // (C)
    Tensor mean;     // (N)
    Tensor rstd;     // (N)
    Tensor dinp;     // (N, C) per `accumulate`
    Tensor dweight;  // (C) +=
    Tensor dbias;    // (C) +=
    Accumulate accumulate;
};

// RMSNorm (Llama): out = inp * rstd * weight over the last dim, rstd[n] = 1 / sqrt(mean_c inp[n, c]^2 + eps), saved
// for the backward. Backward, with norm = inp * rstd and g = dout * weight:
//   dinp = (g - norm * mean_c(g * norm)) * rstd   (= or += per `accumulate`);  dweight += sum_n dout * norm.
struct RmsNormForwardArgs {
    Tensor inp;     // (N, C)
    Tensor weight;  // (C)
    Tensor out;     // (N, C)
    Tensor rstd;    // (N) fp32
    float eps;
};
struct RmsNormBackwardArgs {
    Tensor dout;     // (N, C)
    Tensor inp;      // (N, C)
    Tensor weight;   // (C)
    Tensor rstd;     // (N) fp32, the forward's
    Tensor dinp;     // (N, C) per `accumulate`
    Tensor dweight;  // (C) fp32 or D +=
    Accumulate accumulate;
};

// Rotary position embedding (HF / Megatron, non-interleaved: rotate_half pairs column i with i + HS/2 of a head), in
// place on the Q and K heads of a qkv tensor whose rows are [Q (NH*HS) | K (NKV*HS) | V (NKV*HS)], each block
// head-major; V is not touched. For a head x at position p and i < HS/2, with c = table[p, i], s = table[p, HS/2 + i]
// (rope_table.h: cos and sin of p * f_i):
//   kForward: x[i], x[i + HS/2] = x[i] c - x[i + HS/2] s,  x[i + HS/2] c + x[i] s
//   kInverse: the transpose (the rotation by -p f_i), which is also the backward of kForward on dqkv.
// Each element is computed from fp32 loads and the fp32 table, rounded once to D on store.
enum class RopeDirection : uint8_t { kForward, kInverse };
struct RopeArgs {
    Tensor qkv;        // (N, (NH + 2*NKV)*HS) rotated in place (Q and K heads)
    Tensor table;      // (P, HS) fp32 rope_table rows: [cos(p f_i), i < HS/2 | sin(p f_i)]
    Tensor positions;  // (N) int32 in [0, P) (optional: undefined puts row n at position n % T)
    int64_t T;         // sequence length (positions undefined)
    int64_t NH;        // query heads held here (NH_local)
    int64_t NKV;       // key/value heads held here, dividing NH
    RopeDirection direction;
};

// SwiGLU (Llama's MLP activation): a row of inp is [gate (F) | up (F)], out = silu(gate) * up with
// silu(x) = x * sigmoid(x). Backward: dgate = dout * up * sigmoid(gate) * (1 + gate * (1 - sigmoid(gate))),
// dup = dout * silu(gate), written as dinp's [dgate | dup] (overwrite).
struct SwiGluForwardArgs {
    Tensor inp;  // (N, 2F)
    Tensor out;  // (N, F) must not overlap inp
};
struct SwiGluBackwardArgs {
    Tensor dout;  // (N, F)
    Tensor inp;   // (N, 2F) the forward's
    Tensor dinp;  // (N, 2F) overwritten; must not overlap dout or inp
};

// out = inp @ weight^T + bias
//
// GELU fusion (the MLP's c_fc -> gelu and the backward of gelu -> c_proj, each one op): with gelu_out defined the
// forward also writes gelu_out = gelu(out) (tanh GELU, as GeluForwardArgs), out being the pre-activation that the
// backward needs; with gelu_inp defined the backward's input gradient is dinp = gelu'(gelu_inp) * (dout @ weight),
// where `inp` is gelu(gelu_inp) (overwrite only). Precision: the unfused backends (CPU, the CUDA emulation) run
// their matmul and then their gelu op, so they compute GELU from the rounded pre-activation out (and gelu' from the
// rounded product dout @ weight); cuBLASLt's epilogues compute GELU from the fp32 accumulator plus bias and gelu'
// times the fp32 product before rounding. In bf16 / fp16 the two differ by at most one rounding of GELU's input
// (of gelu''s factor); in fp32 they are the same computation up to summation order.
struct MatmulForwardArgs {
    Tensor inp;            // (N, K)
    Tensor weight;         // (M, K)
    Tensor bias;           // (M) (optional)
    Tensor out;            // (N, M): inp @ weight^T + bias (the pre-activation when gelu_out is defined)
    Tensor gelu_out = {};  // (N, M) = gelu(out) (optional); must not overlap out
};
struct MatmulBackwardArgs {
    Tensor dout;     // (N, M)
    Tensor inp;      // (N, K)
    Tensor weight;   // (M, K)
    Tensor dinp;     // (N, K) per `accumulate` (optional: undefined skips it)
    Tensor dweight;  // (M, K) +=
    Tensor dbias;    // (M) += (optional)
    Accumulate accumulate;
    Tensor gelu_inp = {};  // (N, K) the GELU's input, inp = gelu(gelu_inp) (optional): then dinp is required,
                           // dinp = gelu'(gelu_inp) * (dout @ weight), and accumulate must be kOverwrite
};

// Causal self-attention, multi-head or grouped-query (Megatron's num_query_groups). qkv rows are
// [Q: NH*HS | K: NKV*HS | V: NKV*HS], each block head-major (head h owns columns h*HS .. (h+1)*HS of its block);
// query head h reads key/value head h / (NH / NKV). NKV = 0 means NKV = NH (multi-head attention). out =
// softmax(Q K^T / sqrt(HS) + causal mask) V, per query head, written back head-major as (N, NH_local*HS). lse
// (log-sum-exp of each softmax row) is saved for the backward, which recomputes the probabilities: no (B, NH, T, T)
// tensor is ever kept. dqkv has qkv's layout; dK and dV of a key/value head are the sums over its group's query heads,
// added in a fixed order.
struct AttentionForwardArgs {
    Tensor qkv;       // (B, T, (NH_local + 2*NKV_local)*HS)
    Tensor out;       // (B, T, NH_local*HS)
    Tensor lse;       // (B, NH_local, T) fp32
    int64_t NH;       // query heads held here (NH_local)
    int64_t NKV = 0;  // key/value heads held here (NKV_local), dividing NH; 0: NH
};
struct AttentionBackwardArgs {
    Tensor dout;      // (B, T, NH_local*HS)
    Tensor qkv;       // (B, T, (NH_local + 2*NKV_local)*HS)
    Tensor out;       // (B, T, NH_local*HS) forward output
    Tensor lse;       // (B, NH_local, T)
    Tensor dqkv;      // (B, T, (NH_local + 2*NKV_local)*HS) overwritten
    int64_t NH;       // query heads held here (NH_local)
    int64_t NKV = 0;  // key/value heads held here (NKV_local), dividing NH; 0: NH
};
// The key/value heads of an attention op: NKV, or NH when NKV is 0. Refuses an NKV that does not divide NH.
inline int64_t attention_kv_heads(int64_t NH, int64_t NKV) {
    const int64_t kv = NKV == 0 ? NH : NKV;
    MS_CHECK(NH > 0 && kv > 0 && NH % kv == 0,
             "attention: NKV({}) key/value heads do not divide NH({}) query heads; grouped-query attention gives each "
             "key/value head NH / NKV query heads, so NKV must be a divisor of NH (0 means NH)",
             NKV, NH);
    return kv;
}

// Context parallelism's ring attention (engine/graph/ring_attention.cpp) computes attention one key/value block at a
// time: the local rows' queries against a block of keys and values (the rank's own or one passed around the ring),
// each block's softmax merged into a running fp32 output by its log-sum-exp. Layouts as attention_forward's; kv holds
// key/value head j's K at columns kv_column + j*HS and its V at kv_column + (NKV + j)*HS (kv_column = NH*HS when kv
// is the qkv tensor itself, 0 for a packed [K | V] block).
// Query rows [q_begin, q_begin + q_rows) of each sequence attend to key rows [0, kv_rows) of the same sequence of
// kv: every row to every key, or with `causal` row q_begin + t to key rows u <= t (then q_begin must be 0 and
// kv_rows = q_rows: the rank's own block). With o_b and lse_b the block's normalised output and log-sum-exp:
//   merge false:  acc = o_b, lse = lse_b   (those rows only)
//   merge true:   lse' = log(exp(lse) + exp(lse_b));  acc = acc * exp(lse - lse') + o_b * exp(lse_b - lse')
struct AttentionBlockForwardArgs {
    Tensor qkv;  // (B, T, (NH + 2*NKV)*HS)
    Tensor kv;   // (B, Tk, Wkv) with kv_rows <= Tk
    Tensor acc;  // (B, T, NH*HS) fp32
    Tensor lse;  // (B, NH, T) fp32
    int64_t kv_column = 0;
    int64_t q_begin = 0, q_rows = 0, kv_rows = 0;
    bool causal = false, merge = false;
    int64_t NH = 0, NKV = 0;  // heads held here (NKV 0: NH)
};
// The gradient of one block, from the final output and log-sum-exp (P = exp(S - lse) is then the block's part of the
// whole softmax, and D_t = dO_t . O_t its row term): for the same rows and keys as the forward,
//   dS = P * (dP - D_t);  dq += dS K * scale;  dk += dS^T Q * scale;  dv += P^T dO
// accumulated in fp32 (dq's query rows, dkv's key rows [0, kv_rows); dkv packed [dK | dV]).
struct AttentionBlockBackwardArgs {
    Tensor dout;  // (B, T, NH*HS)
    Tensor qkv;   // (B, T, (NH + 2*NKV)*HS)
    Tensor out;   // (B, T, NH*HS) the forward output
    Tensor lse;   // (B, NH, T) fp32 the final log-sum-exp
    Tensor kv;    // (B, Tk, Wkv)
    Tensor dq;    // (B, T, NH*HS) fp32, +=
    Tensor dkv;   // (B, Tk, 2*NKV*HS) fp32, +=
    int64_t kv_column = 0;
    int64_t q_begin = 0, q_rows = 0, kv_rows = 0;
    bool causal = false;
    int64_t NH = 0, NKV = 0;
};
// dst[r, dst_column + c] = src[r, src_column + c] for r < rows, c < cols, converted to dst's dtype (as cast does):
// packing the key/value columns of qkv for the ring, and the ring's fp32 gradients back into dqkv.
struct CopyColumnsArgs {
    Tensor src;  // (rows, Ws)
    Tensor dst;  // (rows, Wd)
    int64_t src_column = 0, dst_column = 0, cols = 0;
};

// The shape checks of copy_columns, every backend's: fatal, naming the sizes, unless src and dst are 2-D with the
// same rows and both column ranges lie inside them.
inline void check_copy_columns(const CopyColumnsArgs& a) {
    MS_CHECK(a.src.ndim == 2 && a.dst.ndim == 2 && a.src.dim(0) == a.dst.dim(0),
             "copy_columns: src and dst must be (rows, width) with the same rows, got {} and {} dims", a.src.ndim,
             a.dst.ndim);
    MS_CHECK(a.cols >= 0 && a.src_column >= 0 && a.dst_column >= 0 && a.src_column + a.cols <= a.src.dim(1) &&
                 a.dst_column + a.cols <= a.dst.dim(1),
             "copy_columns: {} columns from {} of {} to {} of {}", a.cols, a.src_column, a.src.dim(1), a.dst_column,
             a.dst.dim(1));
}

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
struct GeluForwardArgs {
    Tensor inp;  // (n)
    Tensor out;  // (n) must not alias inp: the backward needs inp
};
struct GeluBackwardArgs {
    Tensor inp;   // (n) forward input
    Tensor dout;  // (n)
    Tensor dinp;  // (n) overwritten (may alias dout)
};

// out = a + (b + bias) (the residual stream). Its backward is the identity on both inputs (and a column sum for
// the bias, which the row-parallel matmul_backward computes). The bias is the row-parallel linear's, added here,
// after the tensor-parallel all-reduce of b, as Megatron does (so every TP layout adds it exactly once).
struct ResidualForwardArgs {
    Tensor a;     // (n)
    Tensor b;     // (n)
    Tensor out;   // (n) may alias a
    Tensor bias;  // (M) with M dividing n: added to b[i] as bias[i % M] (optional)
};

// Vocab-parallel softmax cross-entropy in pieces, so TP can all-reduce between them (docs/design.md §5).
// Columns >= vocab_valid_local (the padded tail of the vocabulary) are masked out of max, sum and gradient.
//   phase kMax:       row_max[n]  = max_j logits[n, j]                               (before an all-reduce max)
//   phase kSumExp:    sum_exp[n]  = sum_j exp(logits[n, j] - row_max[n]);
//                     target_logit[n] = logits[n, targets[n] - vocab_start] if in range, else 0
//                                                                                    (before all-reduce sums)
//   phase kMaxSumExp: what kMax then kSumExp write, in one call, for a tensor-parallel group of one (nothing to
//                     all-reduce between them). A backend may read the logits once: the CUDA kernel keeps an
//                     online max and a sum rescaled as the max grows (its sum then rounds differently from the two
//                     pieces'); the CPU backend runs the two pieces, so its bits are theirs.
// loss[n] = log(sum_exp[n]) + row_max[n] - target_logit[n] is then a few flops on N values.
enum class CrossEntropyPhase : uint8_t { kMax, kSumExp, kMaxSumExp };
struct CrossEntropyForwardArgs {
    Tensor logits;        // (N, Vp_local)
    Tensor targets;       // (N) int32 global ids
    Tensor row_max;       // (N) fp32: written in kMax and kMaxSumExp, read in kSumExp
    Tensor sum_exp;       // (N) fp32: written in kSumExp and kMaxSumExp
    Tensor target_logit;  // (N) fp32: written in kSumExp and kMaxSumExp
    int64_t vocab_start;
    int64_t vocab_valid_local;  // number of unmasked columns in this shard
    CrossEntropyPhase phase;
};
// dlogits[n, j] = dloss[n] * (softmax[n, j] - [j == target]), 0 in masked columns. Written over logits.
struct CrossEntropyBackwardArgs {
    Tensor logits;   // (N, Vp_local) in: logits, out: dlogits
    Tensor targets;  // (N) int32
    Tensor row_max;  // (N) global max
    Tensor sum_exp;  // (N) global sum
    Tensor dloss;    // (N) fp32, e.g. 1 / (tokens per step)
    int64_t vocab_start;
    int64_t vocab_valid_local;
};

// The LM head and its loss in one op, chunk by chunk over the rows, so the (N, Vp_local) logits are never held whole
// (issue 14). For each chunk of rows: logits = lnf @ wte^T, rounded to D as matmul_forward stores them; the rows'
// losses as cross_entropy_forward (kMaxSumExp) defines them, padded columns >= vocab_valid_local masked out; and with
// dloss defined the backward: dlogits as cross_entropy_backward defines them (rounded to D, masked columns 0), then
// dlnf = dlogits @ wte (overwrite) and dwte += dlogits^T @ lnf. So the op computes what matmul_forward, the
// cross-entropy forward and backward and matmul_backward compute on the whole logits, up to summation order: dwte's
// product is summed chunk by chunk (each chunk's fp32 product added into dwte), and a backend may order the exp-sum
// differently (the CPU's fp32 rows have the bits of its cross_entropy ops; the CUDA backend runs kMaxSumExp).
// Tensor parallelism: a group of one only (vocab_start must be 0). A vocab-parallel head needs all-reduces of the
// row max and the sums between a chunk's phases; for tp > 1 the model runs the unfused ops.
// Memory: nothing larger than one chunk of logits is held, in `scratch`, which the caller plans with
// lm_head_loss_scratch_elems(); the op allocates no logits of its own. The chunk's size is the backend's choice
// (lm_head_loss_chunk_rows) unless chunk_rows says otherwise; dwte's bits depend on it (its summation order).
struct LmHeadLossArgs {
    Tensor lnf;      // (N, C) the final LayerNorm's output
    Tensor wte;      // (Vp_local, C) the output embedding (tied to the token embedding)
    Tensor targets;  // (N) int32 global ids
    Tensor dloss;    // (N) fp32 per-row loss gradient, e.g. loss_scale / N (optional: undefined runs the forward only)
    Tensor losses;   // (N) fp32 = log(sum_exp) + row_max - target_logit, overwritten
    Tensor dlnf;     // (N, C) overwritten (required with dloss, else unused)
    Tensor dwte;     // (Vp_local, C) fp32 or D += (required with dloss, else unused)
    Tensor scratch;  // (>= lm_head_loss_scratch_elems(...)) fp32: a chunk's logits and statistics (contents undefined)
    int64_t vocab_start;        // 0: a tensor-parallel group of one
    int64_t vocab_valid_local;  // number of unmasked columns
    int64_t chunk_rows = 0;     // rows per chunk; 0: lm_head_loss_chunk_rows(kind, D, N, Vp_local)
};
enum class BackendKind : uint8_t;  // below
// The rows per chunk a backend of `kind` picks for lm_head_loss on activation dtype D (1 <= rows <= max(N, 1)): the
// CPU keeps a chunk's logits near its caches, a GPU takes chunks large enough that the GEMMs run at full rate.
int64_t lm_head_loss_chunk_rows(BackendKind kind, DType D, int64_t N, int64_t Vp_local);
// The fp32 elements of lm_head_loss's scratch on such a backend, for chunks of chunk_rows rows (0: the backend's
// choice above).
int64_t lm_head_loss_scratch_elems(BackendKind kind, DType D, int64_t N, int64_t Vp_local, int64_t chunk_rows = 0);

// One fused AdamW pass (decoupled weight decay, bias correction), for n contiguous elements:
//   g = grad * grad_scale;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   param -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + weight_decay * param )
struct AdamWArgs {
    Tensor param;  // (n) fp32: the master weights
    Tensor grad;   // (n) fp32, or bf16 / fp16 (16-bit gradients): widened to fp32 on load
    Tensor m;      // (n) fp32
    Tensor v;      // (n) fp32
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale;   // clipping factor folded into the pass
    int64_t step;       // t >= 1, for the bias corrections
    Tensor param_copy;  // (n) bf16 / fp16 (optional): = from_float<D>(updated param), the model's weights (fused cast)
};

// dst[i] = src[i] converted to dst's dtype (fp32 <-> bf16 / fp16, or a copy when the dtypes agree): the model's
// 16-bit weights from the fp32 master weights after each optimizer step. Rounds to nearest even (half.h).
struct CastArgs {
    Tensor src;  // (n)
    Tensor dst;  // (n) must not overlap src unless both are the same tensor of the same dtype
};

enum class BackendKind : uint8_t { kCPU, kCUDA };
// run.backend's config value for a kind ("cpu" or "cuda"); parse_backend_kind (run_layout.h) is its inverse.
std::string_view backend_kind_name(BackendKind kind);

// The memory of the devices a backend's ops run on, for the trainer's memory check (engine/train/plan.h): each
// device's total and how many this process sees. {0, 0} for host memory (the CPU backend, the CUDA emulation).
struct DeviceMemory {
    size_t total_bytes = 0;  // of the device this rank runs on
    int devices = 0;         // visible to this process (ranks of a node share them: local rank % devices)
};
enum class OpMode : uint8_t { kFast, kReference };

class Backend {
  public:
    virtual ~Backend() = default;
    virtual std::string_view name() const = 0;
    virtual bool supports(OpKind op, DType dtype) const = 0;
    // Completes every op issued so far.
    virtual void synchronize() = 0;
    // True when ops may still run after their call returns (CUDA: launches on a stream). Then the host must call
    // synchronize() before it reads an op's output, before it writes a buffer an earlier op may still read, and
    // before a collective touches such buffers (comm/synchronizing_communicator.h does that for collectives).
    virtual bool asynchronous() const { return false; }
    // The device the ops run on, for logs and the MFU peak table, e.g. "NVIDIA H200"; "" for the host CPU.
    virtual std::string device_name() const { return {}; }
    // The memory the arena comes from when it is a device's ({} for host memory).
    virtual DeviceMemory device_memory() const { return {}; }
    // The device's PCI bus id as CUDA spells it ("0000:3b:00.0"), by which NVML finds it (engine/train/
    // gpu_metrics.h); "" when the ops run on the host.
    virtual std::string pci_bus_id() const { return {}; }
    // Memory of `bytes` bytes for the trainer's arena that both these ops and the host can read and write (CUDA:
    // managed memory on the selected device), or nullptr when plain host memory is that (the CPU backend).
    virtual std::unique_ptr<ArenaMemory> make_arena_memory(size_t bytes);

    virtual void embedding_forward(const EmbeddingForwardArgs& a) = 0;
    virtual void embedding_backward(const EmbeddingBackwardArgs& a) = 0;
    virtual void layernorm_forward(const LayerNormForwardArgs& a) = 0;
    virtual void layernorm_backward(const LayerNormBackwardArgs& a) = 0;
    virtual void matmul_forward(const MatmulForwardArgs& a) = 0;
    virtual void matmul_backward(const MatmulBackwardArgs& a) = 0;
    virtual void attention_forward(const AttentionForwardArgs& a) = 0;
    virtual void attention_backward(const AttentionBackwardArgs& a) = 0;
    virtual void gelu_forward(const GeluForwardArgs& a) = 0;
    virtual void gelu_backward(const GeluBackwardArgs& a) = 0;
    virtual void residual_forward(const ResidualForwardArgs& a) = 0;
    virtual void cross_entropy_forward(const CrossEntropyForwardArgs& a) = 0;
    virtual void cross_entropy_backward(const CrossEntropyBackwardArgs& a) = 0;
    virtual void lm_head_loss(const LmHeadLossArgs& a) = 0;
    virtual void adamw(const AdamWArgs& a) = 0;
    // sum of x[i]^2 over n elements, accumulated in double (for the global gradient norm). x is fp32, bf16 or fp16
    // (a gradient buffer's dtype), each element widened to fp32 and then to double.
    virtual double sum_squares(const Tensor& x) = 0;
    virtual void cast(const CastArgs& a) = 0;
    virtual void rmsnorm_forward(const RmsNormForwardArgs& a) = 0;
    virtual void rmsnorm_backward(const RmsNormBackwardArgs& a) = 0;
    virtual void rope(const RopeArgs& a) = 0;
    virtual void swiglu_forward(const SwiGluForwardArgs& a) = 0;
    virtual void swiglu_backward(const SwiGluBackwardArgs& a) = 0;
    virtual void attention_block_forward(const AttentionBlockForwardArgs& a) = 0;
    virtual void attention_block_backward(const AttentionBlockBackwardArgs& a) = 0;
    virtual void copy_columns(const CopyColumnsArgs& a) = 0;
    // x[:] = 0
    virtual void zero(const Tensor& x) = 0;
};

// The CUDA backend's diagnosis choices, from the config's debug: section (cuda_debug_options(cfg.debug)); they change
// numerics, hence config keys. The defaults are the production path.
enum class CudaFp32Gemm : uint8_t { kFp32, kTf32 };             // debug.cuda_tf32
enum class CudaGelu : uint8_t { kEpilogue, kKernels };          // debug.cuda_gelu_epilogue
enum class CudaAttention : uint8_t { kTensorCores, kScalar };   // debug.cuda_attention (bf16 / fp16)
enum class CudaAttentionBackward : uint8_t { kFused, kSplit };  // debug.cuda_attention_bwd (tensor cores)
struct CudaDebugOptions {
    CudaFp32Gemm fp32_gemm = CudaFp32Gemm::kFp32;
    CudaGelu gelu = CudaGelu::kEpilogue;
    CudaAttention attention = CudaAttention::kTensorCores;
    CudaAttentionBackward attention_backward = CudaAttentionBackward::kFused;
};
struct DebugConfig;  // engine/config/config.h
CudaDebugOptions cuda_debug_options(const DebugConfig& debug);

struct BackendOptions {
    BackendKind kind = BackendKind::kCPU;
    OpMode mode = OpMode::kFast;  // kReference: naive loops, the executable spec, for tests
    int num_threads = 0;          // 0: OMP_NUM_THREADS if set, else this node's cores shared among its local_size ranks
    int local_rank = 0;           // kCUDA: this rank runs on device local_rank % (devices visible)
    int local_size = 1;           // the ranks on this node
    CudaDebugOptions cuda;        // kCUDA only
};

// kCPU: the CPU backend. kCUDA: the CUDA backend registered by this binary (fatal when there is none; the config
// validation refuses run.backend: cuda first, with a sentence, when cuda_backend_name() is null).
std::unique_ptr<Backend> make_backend(const BackendOptions& options);

// The CUDA backend lives in libraries that depend on ms_engine (engine/backends/cuda/: ms_cuda_backend, or
// ms_cuda_emu for tests), so ms_engine code reaches it through a factory that a binary linking one registers at
// the top of main(), before any other thread exists (install_cuda_backend(), cuda_backend.h). That is the engine's
// one piece of process-wide backend state; the alternative, ms_engine depending on the CUDA libraries, would make
// every CPU-only binary and test link cudart.
using BackendFactory = std::unique_ptr<Backend> (*)(const BackendOptions& options);
// name: "cuda" (kernels on a GPU) or "cuda-emulated" (the same kernels on the CPU emulation, for tests).
void register_cuda_backend(const char* name, BackendFactory make);
// The registered CUDA backend's name, or nullptr when this binary has none.
const char* cuda_backend_name();
// For planning without a GPU (plan, the simulator's tests): where this binary has no CUDA backend, registers a
// stand-in, so that configs naming run.backend: cuda validate and plan the CUDA graphs; building it throws a
// UserError that says to rebuild with CUDA. Does nothing when a CUDA backend is registered.
void register_planning_cuda_backend();

}  // namespace ms
