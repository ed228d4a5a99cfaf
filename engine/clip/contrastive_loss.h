// contrastive_loss.h: CLIP's symmetric InfoNCE loss over the data-parallel global batch, forward and backward, on the
// host in fp32 with double accumulation.
//
// The definition is open_clip's ClipLoss with gather_with_grad and local_loss (Radford et al. 2021). Each rank of
// `dp` holds b rows of image and of text features, (b, D) fp32, the towers' projections before normalisation;
// every rank has the same b. Rank r's rows are global rows r*b .. r*b+b-1 (N = dp*b rows in all):
//   u = x / max(||x||, 1e-12)                                     per row (torch.nn.functional.normalize)
//   U_img, U_txt (N, D)                                           all-gathered u, in rank order
//   s = exp(min(p, log(max_logit_scale)))                         p: the logit-scale parameter (CLIP's clamp)
//   local loss = 1/(2b) * sum over local rows i with global index g of
//                [ CE(s * u_img_i . U_txt^T, g) + CE(s * u_txt_i . U_img^T, g) ]
// The backward takes the gradient of that local loss w.r.t. every global normalised row, sums it over dp back to
// the row's owner (a reduce-scatter: the all-gather's adjoint), and carries it through the normalisation to the
// unnormalised local rows. So rank r's feature gradient is d(sum over ranks of local losses)/dx_r = dp * d(global
// mean loss)/dx_r. Back through the tower to its parameters, then averaged over dp by the trainer's gradient
// all-reduce, this gives exactly the gradient of the global batch's mean loss: the mean over ranks of the dp-scaled
// per-rank parameter gradients is the sum over all rows of d(global mean)/dx * dx/dtheta. The logit-scale gradient
// is d(local loss)/dp, not reduced here: its dp average (the trainer's) is d(global mean loss)/dp.
//
// Numerics: dot products, log-sum-exps and every sum over rows or features accumulate in double, each in a fixed
// order that does not depend on the thread count, so the results are the same bits for the same inputs and dp size
// (given dp's fp32 sums are, as MPI's and NCCL's are for a fixed group).
// The (b, N) similarity blocks are held in double; features, the gathered rows and the gradients that cross ranks are
// fp32. All gradients carry the factor grad_scale (fp16 loss scaling): it multiplies d(loss)/d(logits) before
// anything else, so a power-of-two grad_scale scales every gradient exactly.
//
// Collectives per call on dp, in this order on every rank: two all-gathers (image, text rows), one all-reduce of
// the logged statistics, and in the backward two reduce-scatters (image, text gradients).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "comm/communicator.h"

namespace ms::clip {

// torch.nn.functional.normalize's default eps: rows shorter than this are divided by it instead of their norm.
inline constexpr double kNormalizeEps = 1e-12;
// CLIP's clamp of the logit scale (exp of the parameter), which keeps the softmax from becoming too sharp.
inline constexpr float kMaxLogitScale = 100.0f;

// a (D) . b (D) accumulated in double, in a fixed order: the one dot product of the loss and of the metrics.
double dot(const float* a, const float* b, int64_t D);

// u (rows, D) = x (rows, D) / max(||x||, kNormalizeEps) row by row; norms (rows), when not empty, gets ||x|| of
// each row (before the eps floor). The norm accumulates in double.
void l2_normalize_rows(std::span<const float> x, int64_t rows, int64_t D, std::span<float> u,
                       std::span<double> norms = {});

struct ContrastiveLossResult {
    float loss = 0;                    // mean over the N global rows (the mean over dp of local_loss): for logging
    float local_loss = 0;              // mean over this rank's b rows: the loss whose gradients are returned
    float logit_scale = 0;             // s, the clamped exp of the parameter
    float i2t_accuracy = 0;            // fraction of the N global images whose top-1 text (ties: lower index) is theirs
    float dlogit_scale_param = 0;      // grad_scale * d(local_loss)/dp; 0 when p > log(max_logit_scale)
    bool logit_scale_clamped = false;  // p > log(max_logit_scale): s is max_logit_scale exactly
};

// Holds the scratch for one (b, D, dp) shape, sized once, so that a step allocates nothing. Not thread-safe; one
// object per dp communicator and feature pair.
class ContrastiveLoss {
  public:
    // Collective over dp: checks that every rank has the same b and D.
    ContrastiveLoss(int64_t b, int64_t D, Communicator& dp, float max_logit_scale = kMaxLogitScale);

    // The loss of image (b, D) and text (b, D) with logit-scale parameter p, and its gradients: dimage (b, D) and
    // dtext (b, D) are overwritten with grad_scale * d(sum over ranks of local losses)/d(features) (see the file
    // comment for why the sum), and result.dlogit_scale_param with grad_scale * d(local_loss)/dp.
    ContrastiveLossResult forward_backward(std::span<const float> image, std::span<const float> text,
                                           float logit_scale_param, std::span<float> dimage, std::span<float> dtext,
                                           float grad_scale = 1.0f);
    // The same statistics without the backward (evaluation): fewer collectives, so every rank of dp must call the
    // same one of the two methods.
    ContrastiveLossResult forward(std::span<const float> image, std::span<const float> text, float logit_scale_param);

    int64_t b() const { return b_; }
    int64_t D() const { return D_; }
    int64_t global_rows() const { return N_; }

  private:
    ContrastiveLossResult run_forward(std::span<const float> image, std::span<const float> text,
                                      float logit_scale_param);
    // Fills the gradients and r.dlogit_scale_param from the state run_forward left.
    void backward(ContrastiveLossResult& r, std::span<float> dimage, std::span<float> dtext, float grad_scale);
    // dA_all (N, D) = d(local loss)/d(one tower's gathered rows), before the reduce-scatter (see the .cpp).
    void gather_gradient(std::span<const double> query_dcos, std::span<const double> key_dcos,
                         std::span<const float> other_all, std::span<const float> other_local, std::span<float> dA_all);

    int64_t b_, D_, N_;  // N = dp * b
    Communicator& dp_;
    float max_logit_scale_;
    std::vector<float> img_local_, txt_local_;  // (b, D) normalised local rows
    std::vector<double> img_norm_, txt_norm_;   // (b) ||x|| of the unnormalised local rows
    std::vector<float> img_all_, txt_all_;      // (N, D) gathered normalised rows, rank-major
    // (b, N) cosines u_img_i . U_txt_j and u_txt_i . U_img_j; the backward overwrites them with d(local loss)/d(cosine)
    std::vector<double> i2t_, t2i_;
    std::vector<double> i2t_lse_, t2i_lse_;   // (b) log-sum-exp of each row's logits
    std::vector<double> row_ds_;              // (2b) each row's part of d(local loss)/ds: image rows, then text rows
    std::vector<float> dimg_all_, dtxt_all_;  // (N, D) this rank's gradients w.r.t. the gathered rows
};

// One call's worth of ContrastiveLoss (allocates its scratch and checks b across dp each time): for tests and
// one-off evaluation.
ContrastiveLossResult contrastive_loss(std::span<const float> image, std::span<const float> text, int64_t b, int64_t D,
                                       float logit_scale_param, Communicator& dp, std::span<float> dimage,
                                       std::span<float> dtext, float grad_scale = 1.0f,
                                       float max_logit_scale = kMaxLogitScale);

}  // namespace ms::clip
