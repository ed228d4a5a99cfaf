// test_gpt_vs_torch.cpp: the whole C++ GPT-2 against an independent PyTorch GPT-2 (tests/model/torch_gpt2.py):
// logits, loss, every parameter gradient by name, then the losses of ten AdamW steps, for both CPU op modes.
//
// Export format (the C++ side writes it into a fresh mkdtemp directory; torch_gpt2.py documents the same):
//   shape.json    {L, C, NH, T, V, Vp, F, eps, B, lr, beta1, beta2, adam_eps, weight_decay, clip_grad, steps,
//                  flat_size}; T is both the batch's sequence length and the number of position embeddings
//   params.json   [{name, shape, offset, numel, weight_decay}] in gpt_param_table() order (offsets in elements)
//   params.bin    float32[flat_size], the flat parameter buffer as Gpt::params() holds it
//   tokens.bin, targets.bin   int32[B*T], row-major (B, T)
// The script writes back logits.bin (float32 (B, T, Vp), padded columns included), loss.txt, grads.bin (float32,
// flat layout, 0 in alignment gaps), losses_adamw.txt and norms_adamw.txt (one value per step, loss before the
// step), and the same in float64 (*_f64.*) so the float32 error of both sides can be printed against exact.
//
// The LayerNorm weights and all biases are perturbed away from their constant init before the export, so the
// gradient of every tensor flows through non-trivial values (with bias 0 and gain 1 some paths are degenerate).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/common/binary_files.h"
#include "tests/model/gpt_test_util.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using test::read_bin;
using test::rel_max_error;
using test::write_bin;

constexpr int kB = 3;
constexpr int kSteps = 10;
constexpr uint64_t kSeed = 1234;

OptimizerConfig adamw_config() {
    OptimizerConfig c;
    c.lr = 1e-3f;  // moves the loss by ~0.8 in ten steps while staying far from the chaotic regime
    c.weight_decay = 0.1f;
    c.adam_beta1 = 0.9f;
    c.adam_beta2 = 0.95f;
    c.adam_eps = 1e-8f;
    return c;
}
// The gradient norm moves between ~1.35 and ~1.75 over the ten steps (seed 1234), so this clips some steps and
// not others: both branches of clip_coefficient are exercised.
constexpr float kClipGrad = 1.5f;

// Tolerances, the same for both op modes. Measured with seeds 1..5 and 1234 (OMP_NUM_THREADS=2), the largest
// error of either mode was: logits 4.4e-7, loss 4.8e-7 (1 ulp at 4.1), gradient 7.2e-7 (h.1.ln_2.bias), AdamW
// losses 4.8e-7, gradient norms 2.4e-7. Each tolerance below is ~4-6x that. The float64 columns printed show
// where the error lives: the reference mode is ~1e-7 from exact, torch's own float32 path ~3-4e-7.
constexpr double kTolLogits = 2e-6;  // per row: max |dlogit| / max |logit| of that row, worst row, V real columns
constexpr double kTolLoss = 2e-6;    // |dloss|
constexpr double kTolGrad = 4e-6;    // per tensor: max |dgrad| / max |grad|
constexpr double kTolLosses = 2e-6;  // max over the ten AdamW steps of |dloss|
constexpr double kTolNorm = 1e-6;    // max over the ten AdamW steps of |dnorm| / norm

std::vector<double> read_lines(const fs::path& path) {
    std::vector<double> v;
    std::ifstream f(path);
    for (double x; f >> x;) v.push_back(x);
    return v;
}

// LayerNorm gains 1 + 0.1 n, biases 0.02 n, with n ~ N(0, 1) from a stream of their own.
void perturb_vectors(Gpt& model, uint64_t seed) {
    for (const ParamInfo& p : model.params_info()) {
        if (p.init != InitKind::kConstant) continue;
        float* w = model.params() + p.offset;
        const float amp = p.init_value == 1.0f ? 0.1f : 0.02f;
        for (int64_t i = 0; i < p.numel; ++i) w[i] += amp * philox_normal(seed, name_hash(p.name) ^ 0x5eedu, i);
    }
}

// The model under test, identical for every op mode (init does not depend on the backend).
struct Problem {
    GptShape shape = test::tiny_shape();
    std::vector<int32_t> tokens, targets;  // (kB, T)
    void init(Gpt& model) const {
        model.init_weights(kSeed);
        perturb_vectors(model, kSeed);
    }
};

void export_model(const fs::path& dir, Gpt& model, const Problem& pb, const OptimizerConfig& opt) {
    const GptShape& s = model.shape();
    const int64_t flat = test::flat_size(model);
    const nlohmann::json shape = {{"L", s.L},
                                  {"C", s.C},
                                  {"NH", s.NH},
                                  {"T", s.T},
                                  {"V", s.V},
                                  {"Vp", s.Vp},
                                  {"F", s.F},
                                  {"eps", s.eps},
                                  {"B", kB},
                                  {"lr", opt.lr},
                                  {"beta1", opt.adam_beta1},
                                  {"beta2", opt.adam_beta2},
                                  {"adam_eps", opt.adam_eps},
                                  {"weight_decay", opt.weight_decay},
                                  {"clip_grad", kClipGrad},
                                  {"steps", kSteps},
                                  {"flat_size", flat}};
    nlohmann::json table = nlohmann::json::array();
    for (const ParamInfo& p : model.params_info())
        table.push_back({{"name", p.name},
                         {"shape", p.shape},
                         {"offset", p.offset},
                         {"numel", p.numel},
                         {"weight_decay", p.weight_decay}});
    std::ofstream(dir / "shape.json") << shape.dump(1);
    std::ofstream(dir / "params.json") << table.dump(1);
    write_bin(dir / "params.bin", model.params(), static_cast<size_t>(flat) * sizeof(float));
    write_bin(dir / "tokens.bin", pb.tokens.data(), pb.tokens.size() * sizeof(int32_t));
    write_bin(dir / "targets.bin", pb.targets.data(), pb.targets.size() * sizeof(int32_t));
}

// What torch_gpt2.py computed: float32 (compared against) and float64 (printed, to show where the error lives).
struct TorchResult {
    std::vector<float> logits, grads;
    std::vector<double> logits_x, grads_x;
    double loss = 0, loss_x = 0;
    std::vector<double> losses, losses_x, norms;
};

// Exports the problem, runs the script once for the whole suite and reads its answers back.
class GptVsTorch : public ::testing::TestWithParam<OpMode> {
  protected:
    static void SetUpTestSuite() {
        skip_reason_ = new std::string();
        failure_ = new std::string();
        problem_ = new Problem();
        const std::string python = MS_SYSTEM_PYTHON;
        if (python.empty() || python.find("NOTFOUND") != std::string::npos) {
            *skip_reason_ = "no system python3 was found at configure time (MS_SYSTEM_PYTHON)";
            return;
        }
        Problem& pb = *problem_;
        const int64_t N = int64_t(kB) * pb.shape.T;
        pb.tokens = test::random_tokens(N, pb.shape.V, kSeed, 1);
        pb.targets = test::random_tokens(N, pb.shape.V, kSeed, 2);
        auto backend = test::make_cpu_backend(OpMode::kFast);
        Gpt model(pb.shape, *backend, test::tp_self(), kB);
        pb.init(model);

        std::string tmpl = (fs::temp_directory_path() / "ms_gpt_vs_torch_XXXXXX").string();
        MS_CHECK(mkdtemp(tmpl.data()) != nullptr, "mkdtemp({}) failed", tmpl);
        const fs::path dir = tmpl;
        export_model(dir, model, pb, adamw_config());
        const std::string cmd = python + " " + MS_SOURCE_DIR "/tests/model/torch_gpt2.py " + dir.string();
        const int status = std::system(cmd.c_str());
        const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (rc == 77 || rc == 127) {
            *skip_reason_ = "PyTorch is not importable by " + python + " (install python3-torch); ran: " + cmd;
            fs::remove_all(dir);
            return;
        }
        if (rc != 0) {
            *failure_ = "the torch reference failed with exit code " + std::to_string(rc) + ": " + cmd +
                        " (inputs kept in " + dir.string() + ")";
            return;
        }
        const GptShape& s = pb.shape;
        const int64_t flat = test::flat_size(model);
        torch_ = new TorchResult();
        TorchResult& t = *torch_;
        t.logits = read_bin<float>(dir / "logits.bin", N * s.Vp);
        t.logits_x = read_bin<double>(dir / "logits_f64.bin", N * s.Vp);
        t.grads = read_bin<float>(dir / "grads.bin", flat);
        t.grads_x = read_bin<double>(dir / "grads_f64.bin", flat);
        t.loss = read_lines(dir / "loss.txt").at(0);
        t.loss_x = read_lines(dir / "loss_f64.txt").at(0);
        t.losses = read_lines(dir / "losses_adamw.txt");
        t.losses_x = read_lines(dir / "losses_adamw_f64.txt");
        t.norms = read_lines(dir / "norms_adamw.txt");
        fs::remove_all(dir);
    }
    static void TearDownTestSuite() {
        delete torch_;
        delete problem_;
        delete skip_reason_;
        delete failure_;
        torch_ = nullptr;
        problem_ = nullptr;
        skip_reason_ = nullptr;
        failure_ = nullptr;
    }
    static std::string* skip_reason_;  // non-empty: the reference cannot run here (no python, no torch)
    static std::string* failure_;      // non-empty: the reference ran and failed
    static Problem* problem_;
    static TorchResult* torch_;
};
std::string* GptVsTorch::skip_reason_ = nullptr;
std::string* GptVsTorch::failure_ = nullptr;
Problem* GptVsTorch::problem_ = nullptr;
TorchResult* GptVsTorch::torch_ = nullptr;

TEST_P(GptVsTorch, LogitsLossEveryGradientAndTenAdamWSteps) {
    ASSERT_TRUE(failure_->empty()) << *failure_;
    if (!skip_reason_->empty()) GTEST_SKIP() << *skip_reason_;
    const Problem& pb = *problem_;
    const TorchResult& t = *torch_;
    const GptShape& s = pb.shape;
    const int T = s.T;
    const int64_t N = int64_t(kB) * T;
    const OptimizerConfig opt = adamw_config();
    auto backend = test::make_cpu_backend(GetParam());
    const std::string be = std::string(backend->name());
    Gpt model(s, *backend, test::tp_self(), kB);
    pb.init(model);
    const int64_t flat = test::flat_size(model);

    // ---- one forward + backward ----
    const float loss = model.forward(pb.tokens.data(), pb.targets.data(), kB, T);
    const std::vector<float> logits(model.logits(), model.logits() + N * s.Vp);
    model.zero_grads();
    model.backward();

    // logits: the V real columns of every row (the padded ones are masked and not part of the contract)
    double e_logits = 0, e_logits_x = 0, e_torch_x = 0;
    for (int64_t n = 0; n < N; ++n) {
        const int64_t o = n * s.Vp;
        double scale = 0, err = 0, err_x = 0, err_tx = 0;
        for (int64_t j = 0; j < s.V; ++j) {
            scale = std::max(scale, std::abs(t.logits_x[o + j]));
            err = std::max(err, std::abs(double(logits[o + j]) - t.logits[o + j]));
            err_x = std::max(err_x, std::abs(logits[o + j] - t.logits_x[o + j]));
            err_tx = std::max(err_tx, std::abs(t.logits[o + j] - t.logits_x[o + j]));
        }
        e_logits = std::max(e_logits, err / scale);
        e_logits_x = std::max(e_logits_x, err_x / scale);
        e_torch_x = std::max(e_torch_x, err_tx / scale);
    }
    std::printf("[%s] logits rel err: vs torch %.3g (tol %.3g) | C++ vs f64 %.3g, torch vs f64 %.3g\n", be.c_str(),
                e_logits, kTolLogits, e_logits_x, e_torch_x);
    std::printf("[%s] loss %.9g torch %.9g f64 %.9g: err %.3g (tol %.3g)\n", be.c_str(), loss, t.loss, t.loss_x,
                std::abs(loss - t.loss), kTolLoss);
    EXPECT_LE(e_logits, kTolLogits);
    EXPECT_NEAR(loss, t.loss, kTolLoss);

    // every gradient, by name, relative to its own scale
    double worst = 0;
    std::string worst_name;
    for (const ParamInfo& p : model.params_info()) {
        const float* g = model.grads_f32() + p.offset;
        const double e = rel_max_error(g, t.grads.data() + p.offset, p.numel);
        const double e_x = rel_max_error(g, t.grads_x.data() + p.offset, p.numel);
        const double e_tx = rel_max_error(t.grads.data() + p.offset, t.grads_x.data() + p.offset, p.numel);
        double gmax = 0;
        for (int64_t i = 0; i < p.numel; ++i) gmax = std::max(gmax, std::abs(t.grads_x[p.offset + i]));
        std::printf("  %-24s max|g| %.3e  rel err vs torch %.3g | C++ vs f64 %.3g, torch vs f64 %.3g\n", p.name.c_str(),
                    gmax, e, e_x, e_tx);
        EXPECT_GT(gmax, 0.0) << p.name << " has an all-zero gradient: the comparison would be vacuous";
        EXPECT_LE(e, kTolGrad) << "gradient of " << p.name;
        if (e > worst) worst = e, worst_name = p.name;
    }
    std::printf("[%s] worst gradient rel err %.3g in %s (tol %.3g)\n", be.c_str(), worst, worst_name.c_str(), kTolGrad);

    // ---- ten AdamW steps on the same batch ----
    ASSERT_EQ(t.losses.size(), size_t(kSteps));
    ASSERT_EQ(t.losses_x.size(), size_t(kSteps));
    ASSERT_EQ(t.norms.size(), size_t(kSteps));
    AdamW adamw(model.params_info(), flat, opt, *backend);
    double e_losses = 0, e_norms = 0;
    int clipped = 0;
    for (int step = 0; step < kSteps; ++step) {
        const test::StepResult r =
            test::train_step(model, adamw, *backend, pb.tokens.data(), pb.targets.data(), kB, T, opt.lr, kClipGrad);
        const double e = std::abs(r.loss - t.losses[step]);
        e_losses = std::max(e_losses, e);
        e_norms = std::max(e_norms, std::abs(r.grad_norm - t.norms[step]) / t.norms[step]);
        clipped += r.grad_norm > kClipGrad;
        std::printf("  step %2d loss %.7f torch %.7f f64 %.7f err %.2e | norm %.6f torch %.6f\n", step + 1, r.loss,
                    t.losses[step], t.losses_x[step], e, r.grad_norm, t.norms[step]);
    }
    std::printf("[%s] AdamW losses max err %.3g (tol %.3g), gradient norms max rel err %.3g (tol %.3g)\n", be.c_str(),
                e_losses, kTolLosses, e_norms, kTolNorm);
    EXPECT_LE(e_losses, kTolLosses);
    EXPECT_LE(e_norms, kTolNorm);
    EXPECT_GT(clipped, 0) << "no step was clipped: retune kClipGrad so that both branches are compared";
    EXPECT_LT(clipped, kSteps) << "every step was clipped: retune kClipGrad so that both branches are compared";
}

INSTANTIATE_TEST_SUITE_P(Cpu, GptVsTorch, ::testing::Values(OpMode::kFast, OpMode::kReference),
                         [](const ::testing::TestParamInfo<OpMode>& info) {
                             return info.param == OpMode::kFast ? std::string("Fast") : std::string("Reference");
                         });

}  // namespace
}  // namespace ms
