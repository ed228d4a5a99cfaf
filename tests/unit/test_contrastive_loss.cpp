// test_contrastive_loss.cpp: engine/clip/contrastive_loss.h on one rank (SelfCommunicator), where the local loss is
// the global mean loss and its gradients are the gradients of the whole batch.
//
//   - An independent double-precision reference of the loss, written here from the definition, and central
//     differences of it in double: the fp32 loss and every gradient (both features, the logit-scale parameter) are
//     compared with them.
//   - Cases with closed forms: orthonormal matching pairs, and every row equal.
//   - The clamp of the logit scale, grad_scale, determinism across thread counts and calls.
//   - open_clip's ClipLoss in PyTorch (tests/unit/clip_loss_reference.py), with one rank and emulating two.
// Errors are scale-free (max |ours - reference| / max |reference|, tests/ops/op_test_util.h); with
// MS_OP_TEST_VERBOSE set each check prints its measured error, which is how the tolerances were chosen.
#include "engine/clip/contrastive_loss.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <sys/wait.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "tests/common/binary_files.h"
#include "tests/common/contrastive_loss_grads.h"
#include "tests/common/temp_dir.h"
#include "tests/ops/op_test_util.h"

namespace ms::clip {
namespace {

using test::max_rel_error;
using test::random_floats;
using Grads = test::ContrastiveLossGrads;

void expect_within(const std::string& what, double err, double tol) {
    if (std::getenv("MS_OP_TEST_VERBOSE")) std::printf("  %-44s err %.2e (tol %.0e)\n", what.c_str(), err, tol);
    EXPECT_LE(err, tol) << what;
}

// The loss of the whole batch image (N, D), text (N, D) in double, from the definition (one rank: N = b).
double reference_loss(const std::vector<double>& image, const std::vector<double>& text, int64_t N, int64_t D, double p,
                      double max_logit_scale) {
    auto normalize = [&](const std::vector<double>& x) {
        std::vector<double> u(x.size());
        for (int64_t i = 0; i < N; ++i) {
            double sq = 0;
            for (int64_t d = 0; d < D; ++d) sq += x[i * D + d] * x[i * D + d];
            const double n = std::max(std::sqrt(sq), 1e-12);
            for (int64_t d = 0; d < D; ++d) u[i * D + d] = x[i * D + d] / n;
        }
        return u;
    };
    const std::vector<double> ui = normalize(image), ut = normalize(text);
    const double s = std::exp(std::min(p, std::log(max_logit_scale)));
    double total = 0;
    for (const auto& [q, k] : {std::pair{&ui, &ut}, std::pair{&ut, &ui}}) {
        for (int64_t i = 0; i < N; ++i) {
            std::vector<double> logits(N);
            for (int64_t j = 0; j < N; ++j) {
                double c = 0;
                for (int64_t d = 0; d < D; ++d) c += (*q)[i * D + d] * (*k)[j * D + d];
                logits[j] = s * c;
            }
            const double m = *std::max_element(logits.begin(), logits.end());
            double z = 0;
            for (double l : logits) z += std::exp(l - m);
            total += m + std::log(z) - logits[i];
        }
    }
    return total / static_cast<double>(2 * N);
}

// The whole batch on one rank.
Grads run(const std::vector<float>& image, const std::vector<float>& text, int64_t N, int64_t D, float p,
          float grad_scale = 1.0f) {
    SelfCommunicator self("dp");
    return test::contrastive_loss_grads(image, text, N, D, p, self, grad_scale);
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Central differences of f in double w.r.t. every element of x (perturbed in place and restored), with the step
// that double rounding actually produced.
std::vector<double> numeric_grad(std::vector<double>& x, const std::function<double()>& f, double h) {
    std::vector<double> g(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const double x0 = x[i];
        x[i] = x0 + h;
        const double plus = f(), xp = x[i];
        x[i] = x0 - h;
        const double minus = f(), xm = x[i];
        x[i] = x0;
        g[i] = (plus - minus) / (xp - xm);
    }
    return g;
}

struct Shape {
    int64_t N, D;
    float p;
};
// D = 5 and 37 exercise the dot product's tail after its eight lanes; D = 300 the backward's second chunk of 256;
// p = log(1 / 0.07) is CLIP's initial temperature, 4.0 a sharper softmax late in training.
const Shape kShapes[] = {{6, 5, 2.6592600f}, {9, 37, 4.0f}, {4, 300, 1.0f}};

TEST(ContrastiveLoss, LossAndGradientsMatchADoubleReferenceAndItsCentralDifferences) {
    for (const Shape& sh : kShapes) {
        SCOPED_TRACE("N " + std::to_string(sh.N) + " D " + std::to_string(sh.D));
        const size_t n = static_cast<size_t>(sh.N * sh.D);
        const std::vector<float> image = random_floats(n, 11), text = random_floats(n, 12);
        const Grads g = run(image, text, sh.N, sh.D, sh.p);

        std::vector<double> xi = widen(image), xt = widen(text);
        double p = sh.p;
        auto loss = [&] { return reference_loss(xi, xt, sh.N, sh.D, p, kMaxLogitScale); };
        const double ref = loss();
        // The step: truncation error ~h^2 and cancellation ~1e-16 / h are both far below fp32's rounding.
        const double h = 1e-6;
        const std::vector<double> dimage = numeric_grad(xi, loss, h), dtext = numeric_grad(xt, loss, h);
        std::vector<double> pv = {p};
        const std::vector<double> dp = numeric_grad(
            pv, [&] { return reference_loss(xi, xt, sh.N, sh.D, pv[0], kMaxLogitScale); }, h);

        // The implementation rounds the normalised rows, the gathered gradients and its results to fp32; the
        // differences' rounding error is far below that. Measured <= 3.5e-8 (loss) and <= 1.2e-7 (gradients) over the
        // three shapes; ~8x headroom.
        expect_within("loss vs double reference", std::fabs(g.r.local_loss - ref) / ref, 3e-7);
        EXPECT_EQ(g.r.loss, g.r.local_loss);  // one rank: the global mean is the local one
        expect_within("dimage vs central differences", max_rel_error(g.dimage, dimage), 1e-6);
        expect_within("dtext vs central differences", max_rel_error(g.dtext, dtext), 1e-6);
        expect_within("dlogit_scale vs central differences",
                      std::fabs(g.r.dlogit_scale_param - dp[0]) / std::fabs(dp[0]), 1e-6);
        EXPECT_FALSE(g.r.logit_scale_clamped);
        EXPECT_FLOAT_EQ(g.r.logit_scale, std::exp(sh.p));
    }
}

// Image row i and text row i are c_i * e_i and t_i * e_i (e_i orthonormal, D > N). Every cosine is 1 on the
// diagonal and 0 off it, so in both directions each row's softmax has a = e^s / (e^s + N - 1) on its match and
// q = 1 / (e^s + N - 1) elsewhere, and
//   loss = -log a = log(1 + (N - 1) e^-s),          d loss / dp = s * d loss / ds = -s (1 - a),
//   d loss / d u_img_i = s / N * ((a - 1) e_i + q sum_{j != i} e_j)   (each direction contributes half),
// whose e_i component the normalisation removes: d loss / d x_i = s q / (N c_i) sum_{j != i} e_j.
TEST(ContrastiveLoss, OrthonormalMatchingPairsHaveTheClosedForm) {
    const int64_t N = 4, D = 6;
    const float p = 1.5f;
    const float c[N] = {1.0f, 2.0f, 0.5f, 3.0f}, t[N] = {0.25f, 1.0f, 4.0f, 2.0f};
    std::vector<float> image(N * D, 0.0f), text(N * D, 0.0f);
    for (int64_t i = 0; i < N; ++i) {
        image[i * D + i] = c[i];
        text[i * D + i] = t[i];
    }
    const Grads g = run(image, text, N, D, p);
    const double s = g.r.logit_scale, es = std::exp(s);
    const double a = es / (es + N - 1), q = 1.0 / (es + N - 1);
    std::vector<double> dimage(N * D, 0.0), dtext(N * D, 0.0);
    for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < N; ++j)
            if (j != i) {
                dimage[i * D + j] = s * q / (N * c[i]);
                dtext[i * D + j] = s * q / (N * t[i]);
            }
    // Exact cosines (0 and 1) leave the double softmax and the final rounding to fp32, at most half an fp32 ulp
    // (6e-8 relative): measured 5.4e-8 (loss) and <= 4.3e-8 (gradients).
    expect_within("orthonormal loss", std::fabs(g.r.loss - std::log1p((N - 1) / es)) / std::log1p((N - 1) / es), 1e-7);
    expect_within("orthonormal dimage", max_rel_error(g.dimage, dimage), 1e-7);
    expect_within("orthonormal dtext", max_rel_error(g.dtext, dtext), 1e-7);
    expect_within("orthonormal dlogit_scale", std::fabs(g.r.dlogit_scale_param + s * (1 - a)) / (s * (1 - a)), 1e-7);
    EXPECT_EQ(g.r.i2t_accuracy, 1.0f);
}

// Every row the same vector: every logit is s, each softmax uniform, the loss log N, and every gradient vanishes (the
// softmax minus one-hot sums to zero against equal rows). All images tie with every text: top-1 with ties toward
// the lower index picks text 0 for every image, so only image 0 is right.
TEST(ContrastiveLoss, EqualRowsGiveLogNAndNoGradient) {
    const int64_t N = 5, D = 3;
    std::vector<float> image, text;
    for (int64_t i = 0; i < N; ++i) {
        image.insert(image.end(), {1.0f, -2.0f, 2.0f});
        text.insert(text.end(), {0.5f, -1.0f, 1.0f});
    }
    const Grads g = run(image, text, N, D, 2.0f);
    EXPECT_FLOAT_EQ(g.r.loss, std::log(5.0f));
    // The gradients are sums of terms of size s / N that cancel: what is left is double rounding, far below 1e-12.
    for (float v : g.dimage) EXPECT_LE(std::fabs(v), 1e-12f);
    for (float v : g.dtext) EXPECT_LE(std::fabs(v), 1e-12f);
    EXPECT_LE(std::fabs(g.r.dlogit_scale_param), 1e-12f);
    EXPECT_EQ(g.r.i2t_accuracy, 1.0f / N);
}

TEST(ContrastiveLoss, ClampedLogitScaleIsMaxAndHasNoGradient) {
    const int64_t N = 6, D = 8;
    const std::vector<float> image = random_floats(N * D, 21), text = random_floats(N * D, 22);
    const Grads at5 = run(image, text, N, D, 5.0f), at7 = run(image, text, N, D, 7.0f);
    EXPECT_TRUE(at5.r.logit_scale_clamped);
    EXPECT_EQ(at5.r.logit_scale, 100.0f);
    EXPECT_EQ(at5.r.dlogit_scale_param, 0.0f);
    // Above the bound the parameter no longer matters: the same bits.
    EXPECT_EQ(at5.r.loss, at7.r.loss);
    EXPECT_TRUE(test::bit_identical(at5.dimage, at7.dimage));
    EXPECT_TRUE(test::bit_identical(at5.dtext, at7.dtext));
    // The loss is the reference's with s = 100 (the first test's tolerance; measured 1.8e-8).
    const double ref = reference_loss(widen(image), widen(text), N, D, std::log(100.0), kMaxLogitScale);
    expect_within("clamped loss vs double reference", std::fabs(at5.r.loss - ref) / ref, 3e-7);
    // Just below the bound the gradient is there.
    const Grads below = run(image, text, N, D, 4.6f);
    EXPECT_FALSE(below.r.logit_scale_clamped);
    EXPECT_NE(below.r.dlogit_scale_param, 0.0f);
}

TEST(ContrastiveLoss, PowerOfTwoGradScaleScalesEveryGradientExactly) {
    const int64_t N = 7, D = 12;
    const std::vector<float> image = random_floats(N * D, 31), text = random_floats(N * D, 32);
    const Grads one = run(image, text, N, D, 2.6592600f);
    for (float gs : {1024.0f, 0.125f}) {
        const Grads scaled = run(image, text, N, D, 2.6592600f, gs);
        EXPECT_EQ(scaled.r.loss, one.r.loss);
        EXPECT_EQ(scaled.r.dlogit_scale_param, gs * one.r.dlogit_scale_param);
        for (size_t i = 0; i < one.dimage.size(); ++i) {
            EXPECT_EQ(scaled.dimage[i], gs * one.dimage[i]) << i;
            EXPECT_EQ(scaled.dtext[i], gs * one.dtext[i]) << i;
        }
    }
}

TEST(ContrastiveLoss, SameBitsForAnyThreadCountAndAcrossCalls) {
    const int64_t N = 16, D = 40;
    const std::vector<float> image = random_floats(N * D, 41), text = random_floats(N * D, 42);
    SelfCommunicator self("dp");
    ContrastiveLoss loss(N, D, self);
    std::vector<float> di1(N * D), dt1(N * D), di2(N * D), dt2(N * D);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const ContrastiveLossResult r1 = loss.forward_backward(image, text, 3.0f, di1, dt1);
    omp_set_num_threads(3);
    const ContrastiveLossResult r2 = loss.forward_backward(image, text, 3.0f, di2, dt2);
    omp_set_num_threads(threads);
    EXPECT_EQ(r1.loss, r2.loss);
    EXPECT_EQ(r1.dlogit_scale_param, r2.dlogit_scale_param);
    EXPECT_TRUE(test::bit_identical(di1, di2));
    EXPECT_TRUE(test::bit_identical(dt1, dt2));
    // forward() computes the same statistics without the backward.
    const ContrastiveLossResult f = loss.forward(image, text, 3.0f);
    EXPECT_EQ(f.loss, r1.loss);
    EXPECT_EQ(f.i2t_accuracy, r1.i2t_accuracy);
}

// ---- against PyTorch ----

double read_number(const std::string& path) {
    std::ifstream f(path);
    double x = NAN;
    f >> x;
    EXPECT_TRUE(f.good() || f.eof()) << path;
    return x;
}

// open_clip's ClipLoss (gather_with_grad, local_loss) in float64 autograd on the same float32 features: one rank, and
// two ranks emulated in one process, whose every row receives d(sum of both ranks' local losses)/d(row) = 2 * the
// one-rank gradient (contrastive_loss.h), and whose mean logit-scale gradient is the one-rank one.
TEST(ContrastiveLoss, MatchesOpenClipInPyTorch) {
    const std::string python = MS_SYSTEM_PYTHON;
    if (python.empty() || python.find("NOTFOUND") != std::string::npos)
        GTEST_SKIP() << "no system python3 was found at configure time (MS_SYSTEM_PYTHON)";
    const int64_t N = 8, D = 24;
    const std::vector<float> image = random_floats(N * D, 51, -2.0f, 2.0f),
                             text = random_floats(N * D, 52, -2.0f, 2.0f);
    test::TempDir dir("ms_clip_loss");
    test::write_bin(dir / "image.bin", image);
    test::write_bin(dir / "text.bin", text);
    struct Case {
        float p;
        int world;
    };
    const Case cases[] = {{2.6592600f, 1}, {4.0f, 1}, {5.0f, 1}, {3.0f, 2}};
    {
        std::ofstream spec(dir / "cases.json");
        spec << R"({"N": )" << N << R"(, "D": )" << D << R"(, "max_logit_scale": 100.0, "cases": [)";
        for (size_t c = 0; c < std::size(cases); ++c)
            // The float's exact value as a double, so that torch's parameter is ours.
            spec << (c ? ", " : "")
                 << fmt::format(R"({{"logit_scale_param": {}, "world": {}}})", static_cast<double>(cases[c].p),
                                cases[c].world);
        spec << "]}\n";
    }
    const std::string cmd = python + " " MS_SOURCE_DIR "/tests/unit/clip_loss_reference.py " + dir.path();
    const int status = std::system(cmd.c_str());
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (rc == 77 || rc == 127) GTEST_SKIP() << "PyTorch is not importable by " << python << "; ran: " << cmd;
    ASSERT_EQ(rc, 0) << cmd;
    for (size_t c = 0; c < std::size(cases); ++c) {
        SCOPED_TRACE("case " + std::to_string(c));
        const std::string k = std::to_string(c);
        const Grads g = run(image, text, N, D, cases[c].p);
        const double world = cases[c].world;
        std::vector<double> dimage = test::read_bin<double>(dir / ("dimage_" + k + ".bin"), N * D);
        std::vector<double> dtext = test::read_bin<double>(dir / ("dtext_" + k + ".bin"), N * D);
        for (double& v : dimage) v /= world;
        for (double& v : dtext) v /= world;
        const double loss = read_number(dir / ("loss_" + k + ".txt"));
        const double dlogit = read_number(dir / ("dlogit_" + k + ".txt"));
        // Ours is fp32 with double sums, torch's float64 throughout: the same fp32 roundings as against the double
        // reference, so the same tolerances (measured <= 2.3e-8 for the loss, <= 8.7e-8 for the gradients). The clamped
        // case's scale is exp(log 100) in torch, 100 here: a difference of 1e-16.
        expect_within("loss vs open_clip", std::fabs(g.r.loss - loss) / loss, 3e-7);
        expect_within("dimage vs open_clip", max_rel_error(g.dimage, dimage), 1e-6);
        expect_within("dtext vs open_clip", max_rel_error(g.dtext, dtext), 1e-6);
        if (g.r.logit_scale_clamped) {
            EXPECT_EQ(dlogit, 0.0);
            EXPECT_EQ(g.r.dlogit_scale_param, 0.0f);
        } else {
            expect_within("dlogit_scale vs open_clip", std::fabs(g.r.dlogit_scale_param - dlogit) / std::fabs(dlogit),
                          1e-6);
        }
    }
}

}  // namespace
}  // namespace ms::clip
