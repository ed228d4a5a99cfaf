// contrastive_loss.cpp: the loss of contrastive_loss.h. Loops that write distinct outputs run under OpenMP; every sum
// is computed by one thread in a fixed order, so the thread count never changes a bit.
#include "engine/clip/contrastive_loss.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "engine/core/check.h"

namespace ms::clip {
namespace {

// log(sum_j exp(s * c_j)) over a row c (n), shifted by its maximum so that no term overflows.
double log_sum_exp(const double* c, int64_t n, double s) {
    double m = -INFINITY;
    for (int64_t j = 0; j < n; ++j) m = std::max(m, s * c[j]);
    double z = 0;
    for (int64_t j = 0; j < n; ++j) z += std::exp(s * c[j] - m);
    return m + std::log(z);
}

// The index of the largest entry of c (n), the lowest one among equal maxima.
int64_t arg_max(const double* c, int64_t n) {
    int64_t best = 0;
    for (int64_t j = 1; j < n; ++j)
        if (c[j] > c[best]) best = j;
    return best;
}

// dx (D) = d(loss)/dx from du (D) = d(loss)/du, u = x / max(||x||, eps), in place: (du - u (u . du)) / ||x||, or
// du / eps where the floor holds (the norm is then a constant, as torch's clamp_min passes no gradient below it).
void normalize_backward(float* du, const float* u, double norm, int64_t D) {
    if (norm >= kNormalizeEps) {
        const double proj = dot(u, du, D);
        for (int64_t d = 0; d < D; ++d)
            du[d] = static_cast<float>((static_cast<double>(du[d]) - static_cast<double>(u[d]) * proj) / norm);
    } else {
        for (int64_t d = 0; d < D; ++d) du[d] = static_cast<float>(static_cast<double>(du[d]) / kNormalizeEps);
    }
}

}  // namespace

// Eight independent partial sums (which the compiler can keep in vector lanes) combined in a fixed tree: a long sum
// without a serial dependency chain, and the same bits on every run.
double dot(const float* a, const float* b, int64_t D) {
    std::array<double, 8> acc{};
    int64_t d = 0;
    for (; d + 8 <= D; d += 8)
        for (int k = 0; k < 8; ++k) acc[k] += static_cast<double>(a[d + k]) * static_cast<double>(b[d + k]);
    double tail = 0;
    for (; d < D; ++d) tail += static_cast<double>(a[d]) * static_cast<double>(b[d]);
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

void l2_normalize_rows(std::span<const float> x, int64_t rows, int64_t D, std::span<float> u, std::span<double> norms) {
    const size_t n = static_cast<size_t>(rows * D);
    MS_CHECK(x.size() == n && u.size() == n, "l2_normalize_rows: x has {} and u {} elements, not rows {} * D {}",
             x.size(), u.size(), rows, D);
    MS_CHECK(norms.empty() || norms.size() == static_cast<size_t>(rows), "l2_normalize_rows: {} norms for {} rows",
             norms.size(), rows);
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x.data() + r * D;
        const double norm = std::sqrt(dot(xr, xr, D));
        const double denom = std::max(norm, kNormalizeEps);
        for (int64_t d = 0; d < D; ++d) u[r * D + d] = static_cast<float>(static_cast<double>(xr[d]) / denom);
        if (!norms.empty()) norms[r] = norm;
    }
}

ContrastiveLoss::ContrastiveLoss(int64_t b, int64_t D, Communicator& dp, float max_logit_scale)
    : b_(b), D_(D), N_(b * dp.size()), dp_(dp), max_logit_scale_(max_logit_scale) {
    MS_CHECK(b > 0 && D > 0 && b <= INT32_MAX && D <= INT32_MAX, "contrastive loss: b = {}, D = {}", b, D);
    MS_CHECK(max_logit_scale > 0, "contrastive loss: max_logit_scale {} is not positive", max_logit_scale);
    // Every rank's rows must be the same count for the gathers to line up; a mismatch would otherwise show only as
    // an MPI size error, or as silently misplaced rows.
    const int32_t mine[2] = {static_cast<int32_t>(b), static_cast<int32_t>(D)};
    std::vector<int32_t> all(2 * static_cast<size_t>(dp.size()));
    dp.all_gather(std::span<const int32_t>(mine), std::span<int32_t>(all)).wait();
    for (int r = 0; r < dp.size(); ++r)
        MS_CHECK(all[2 * r] == mine[0] && all[2 * r + 1] == mine[1],
                 "contrastive loss: rank {} of {} holds (b, D) = ({}, {}) but rank {} holds ({}, {}); every rank "
                 "must hold the same number of rows of the same width",
                 dp.rank(), dp.name(), b, D, r, all[2 * r], all[2 * r + 1]);
    const size_t local = static_cast<size_t>(b * D), global = static_cast<size_t>(N_ * D);
    img_local_.resize(local);
    txt_local_.resize(local);
    img_norm_.resize(static_cast<size_t>(b));
    txt_norm_.resize(static_cast<size_t>(b));
    img_all_.resize(global);
    txt_all_.resize(global);
    i2t_.resize(static_cast<size_t>(b * N_));
    t2i_.resize(static_cast<size_t>(b * N_));
    i2t_lse_.resize(static_cast<size_t>(b));
    t2i_lse_.resize(static_cast<size_t>(b));
    row_ds_.resize(2 * static_cast<size_t>(b));
    dimg_all_.resize(global);
    dtxt_all_.resize(global);
}

ContrastiveLossResult ContrastiveLoss::forward(std::span<const float> image, std::span<const float> text,
                                               float logit_scale_param) {
    return run_forward(image, text, logit_scale_param);
}

ContrastiveLossResult ContrastiveLoss::forward_backward(std::span<const float> image, std::span<const float> text,
                                                        float logit_scale_param, std::span<float> dimage,
                                                        std::span<float> dtext, float grad_scale) {
    ContrastiveLossResult r = run_forward(image, text, logit_scale_param);
    backward(r, dimage, dtext, grad_scale);
    return r;
}

ContrastiveLossResult ContrastiveLoss::run_forward(std::span<const float> image, std::span<const float> text,
                                                   float logit_scale_param) {
    const size_t local = static_cast<size_t>(b_ * D_);
    MS_CHECK(image.size() == local && text.size() == local,
             "contrastive loss: image has {} and text {} elements, not b {} * D {}", image.size(), text.size(), b_, D_);
    l2_normalize_rows(image, b_, D_, img_local_, img_norm_);
    l2_normalize_rows(text, b_, D_, txt_local_, txt_norm_);
    {
        Handle hi = dp_.all_gather(std::span<const float>(img_local_), std::span<float>(img_all_));
        Handle ht = dp_.all_gather(std::span<const float>(txt_local_), std::span<float>(txt_all_));
        hi.wait();
        ht.wait();
    }

    ContrastiveLossResult r;
    r.logit_scale_clamped = static_cast<double>(logit_scale_param) > std::log(static_cast<double>(max_logit_scale_));
    r.logit_scale =
        r.logit_scale_clamped ? max_logit_scale_ : static_cast<float>(std::exp(static_cast<double>(logit_scale_param)));
    const double s = r.logit_scale;

    const int64_t b = b_, N = N_, D = D_;
#pragma omp parallel for schedule(static)
    for (int64_t ij = 0; ij < b * N; ++ij) {
        const int64_t i = ij / N, j = ij % N;
        i2t_[ij] = dot(&img_local_[i * D], &txt_all_[j * D], D);
        t2i_[ij] = dot(&txt_local_[i * D], &img_all_[j * D], D);
    }
    const int64_t first = static_cast<int64_t>(dp_.rank()) * b;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < b; ++i) {
        i2t_lse_[i] = log_sum_exp(&i2t_[i * N], N, s);
        t2i_lse_[i] = log_sum_exp(&t2i_[i * N], N, s);
    }
    double sum_ce = 0;
    int64_t correct = 0;
    for (int64_t i = 0; i < b; ++i) {
        const int64_t g = first + i;
        sum_ce += (i2t_lse_[i] - s * i2t_[i * N + g]) + (t2i_lse_[i] - s * t2i_[i * N + g]);
        correct += arg_max(&i2t_[i * N], N) == g ? 1 : 0;
    }
    r.local_loss = static_cast<float>(sum_ce / static_cast<double>(2 * b));
    // Counts below 2^24 are exact in fp32.
    float stats[2] = {r.local_loss, static_cast<float>(correct)};
    dp_.all_reduce(std::span<float>(stats), ReduceOp::kSum).wait();
    r.loss = stats[0] / static_cast<float>(dp_.size());
    r.i2t_accuracy = static_cast<float>(static_cast<double>(stats[1]) / static_cast<double>(N));
    return r;
}

void ContrastiveLoss::backward(ContrastiveLossResult& r, std::span<float> dimage, std::span<float> dtext,
                               float grad_scale) {
    const size_t local = static_cast<size_t>(b_ * D_);
    MS_CHECK(dimage.size() == local && dtext.size() == local,
             "contrastive loss: dimage has {} and dtext {} elements, not b {} * D {}", dimage.size(), dtext.size(), b_,
             D_);
    const int64_t b = b_, N = N_, D = D_;
    const int64_t first = static_cast<int64_t>(dp_.rank()) * b;
    const double s = r.logit_scale;
    // d(local loss)/d(logit) = (softmax - one-hot) / (2b), times grad_scale first so that a power of two scales every
    // later product exactly. The cosine blocks are overwritten with d/d(cosine) = s * d/d(logit); row_ds_ keeps
    // each row's sum of d/d(logit) * cosine, its part of d/ds.
    const double coef = static_cast<double>(grad_scale) / static_cast<double>(2 * b);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < 2 * b; ++i) {
        const bool i2t = i < b;
        const int64_t row = i2t ? i : i - b;
        double* c = i2t ? &i2t_[row * N] : &t2i_[row * N];
        const double lse = i2t ? i2t_lse_[row] : t2i_lse_[row];
        const int64_t g = first + row;
        double ds = 0;
        for (int64_t j = 0; j < N; ++j) {
            const double dlogit = (std::exp(s * c[j] - lse) - (j == g ? 1.0 : 0.0)) * coef;
            ds += dlogit * c[j];
            c[j] = s * dlogit;
        }
        row_ds_[i] = ds;
    }
    double ds = 0;
    for (int64_t i = 0; i < 2 * b; ++i) ds += row_ds_[i];
    // ds/dp = s where the clamp does not hold, 0 where it does.
    r.dlogit_scale_param = r.logit_scale_clamped ? 0.0f : static_cast<float>(ds * s);

    gather_gradient(i2t_, t2i_, txt_all_, txt_local_, dimg_all_);
    Handle hi = dp_.reduce_scatter(std::span<const float>(dimg_all_), dimage, ReduceOp::kSum);
    gather_gradient(t2i_, i2t_, img_all_, img_local_, dtxt_all_);
    Handle ht = dp_.reduce_scatter(std::span<const float>(dtxt_all_), dtext, ReduceOp::kSum);
    hi.wait();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < b; ++i) normalize_backward(&dimage[i * D], &img_local_[i * D], img_norm_[i], D);
    ht.wait();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < b; ++i) normalize_backward(&dtext[i * D], &txt_local_[i * D], txt_norm_[i], D);
}

// For tower A with local rows as queries in `query_dcos` (b, N) against the other tower's gathered rows other_all
// (N, D), and as keys in `key_dcos` (b, N) of the other tower's local rows other_local (b, D):
//   dA_all[j] = sum_i key_dcos[i, j] * other_local[i]  +  (j = first + i') sum_k query_dcos[i', k] * other_all[k]
// accumulated in double per element in that order, over chunks of D so that the accumulator lives on the stack.
void ContrastiveLoss::gather_gradient(std::span<const double> query_dcos, std::span<const double> key_dcos,
                                      std::span<const float> other_all, std::span<const float> other_local,
                                      std::span<float> dA_all) {
    constexpr int64_t kChunk = 256;
    const int64_t b = b_, N = N_, D = D_;
    const int64_t first = static_cast<int64_t>(dp_.rank()) * b;
    // Dynamic: the b rows that are this rank's own carry N times more work than the others.
#pragma omp parallel for schedule(dynamic)
    for (int64_t j = 0; j < N; ++j) {
        const int64_t own = j - first;  // the local query row that is global row j, if any
        for (int64_t d0 = 0; d0 < D; d0 += kChunk) {
            const int64_t n = std::min(kChunk, D - d0);
            std::array<double, kChunk> acc{};
            for (int64_t i = 0; i < b; ++i) {
                const double w = key_dcos[i * N + j];
                const float* o = &other_local[i * D + d0];
                for (int64_t d = 0; d < n; ++d) acc[d] += w * static_cast<double>(o[d]);
            }
            if (own >= 0 && own < b) {
                for (int64_t k = 0; k < N; ++k) {
                    const double w = query_dcos[own * N + k];
                    const float* o = &other_all[k * D + d0];
                    for (int64_t d = 0; d < n; ++d) acc[d] += w * static_cast<double>(o[d]);
                }
            }
            for (int64_t d = 0; d < n; ++d) dA_all[j * D + d0 + d] = static_cast<float>(acc[d]);
        }
    }
}

ContrastiveLossResult contrastive_loss(std::span<const float> image, std::span<const float> text, int64_t b, int64_t D,
                                       float logit_scale_param, Communicator& dp, std::span<float> dimage,
                                       std::span<float> dtext, float grad_scale, float max_logit_scale) {
    ContrastiveLoss loss(b, D, dp, max_logit_scale);
    return loss.forward_backward(image, text, logit_scale_param, dimage, dtext, grad_scale);
}

}  // namespace ms::clip
