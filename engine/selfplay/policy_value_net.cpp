// policy_value_net.cpp: the self-play network as an Evaluator and its training step (policy_value_net.h).
#include "engine/selfplay/policy_value_net.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

#include "engine/core/check.h"
#include "engine/model/policy_value.h"
#include "engine/optim/distributed_optimizer.h"

namespace ms::selfplay {
namespace {

// The batch sizes the network is compiled for: n rounded up to a multiple of 8 (at most 7 positions of padding, the
// search's batches being a few dozen positions), capped at max_batch.
int padded_batch(int n, int max_batch) {
    constexpr int kStep = 8;
    return std::min((n + kStep - 1) / kStep * kStep, max_batch);
}

}  // namespace

PolicyValueNet::PolicyValueNet(const GptShape& shape, Backend& backend, const ProcessGroups& groups, int max_batch)
    : shape_(shape), backend_(backend), groups_(groups), max_batch_(max_batch) {
    MS_CHECK(shape.arch == ModelArch::kPolicyValue && max_batch >= 1, "PolicyValueNet: shape or max_batch {}",
             max_batch);
    table_ = policy_value_param_table(shape, groups.tp->size());
    flat_ = table_.back().offset + table_.back().numel;
    const int64_t padded = padded_flat_size(flat_, groups.dp->size());
    params_ = MemoryBlock(static_cast<size_t>(padded) * sizeof(float), nullptr, MemCategory::kParameter,
                          "policy-value parameters");
    grads_ = MemoryBlock(static_cast<size_t>(padded) * sizeof(float), nullptr, MemCategory::kGradient,
                         "policy-value gradients");
    std::fill_n(params(), padded, 0.0f);
    std::fill_n(grads(), padded, 0.0f);
    grad_placement_ = graph::GradPlacement(grads(), DType::kF32, padded);
    GptProgram::Options o;
    o.max_batch = max_batch;
    o.part = GptPart{.first_layer = 0, .num_layers = -1, .embedding = true, .head = false};
    o.params = params();
    o.weights = params();
    o.grads = grad_placement_;
    program_ = std::make_unique<GptProgram>(shape, backend, *groups.tp, o);
}

PolicyValueNet::~PolicyValueNet() = default;

void PolicyValueNet::init_weights(uint64_t seed, float init_std) {
    init_params(table_, params(), seed, init_std, groups_.tp->rank(), groups_.tp->size(), INT64_MAX);
}

void PolicyValueNet::check_board(int rows, int cols) const {
    if (rows > shape_.board_rows || cols > shape_.board_cols)
        throw UserError(fmt::format(
            "selfplay error: a {} x {} board is larger than the network embeds ({} x {}: selfplay.network.board_rows "
            "and board_cols); hint: raise them to the largest board of the curriculum",
            rows, cols, shape_.board_rows, shape_.board_cols));
}

void PolicyValueNet::forward(std::span<const games::Connect4> positions, float loss_scale) {
    const int n = static_cast<int>(positions.size());
    MS_CHECK(n >= 1 && n <= max_batch_, "PolicyValueNet: {} positions in one forward (at most {})", n, max_batch_);
    rows_ = positions[0].rows();
    cols_ = positions[0].cols();
    check_board(rows_, cols_);
    batch_ = loss_scale == 0.0f ? padded_batch(n, max_batch_) : n;
    const int T = rows_ * cols_ + 1, A = cols_;
    const size_t width = static_cast<size_t>(policy_value_input_width(shape_)), board = static_cast<size_t>(T) * width;
    backend_.synchronize();  // an earlier step's ops may still read the input
    // the features go straight into the program's input (host memory: run.backend cpu)
    const std::span<float> features(static_cast<float*>(program_->tensor("cells", 0)),
                                    static_cast<size_t>(batch_) * board);
    summary_rows_.resize(static_cast<size_t>(batch_));
    cells_.resize(static_cast<size_t>(T - 1));
    flags_.resize(shape_.threat_features ? static_cast<size_t>(T - 1) : 0);
    for (int i = 0; i < batch_; ++i) {
        const games::Connect4& p = positions[static_cast<size_t>(std::min(i, n - 1))];  // padding repeats the last
        MS_CHECK(p.rows() == rows_ && p.cols() == cols_, "PolicyValueNet: boards of two sizes in one batch");
        p.cells(cells_);
        if (shape_.threat_features) p.cell_flags(flags_);
        write_board_features(shape_, rows_, cols_, cells_, flags_, p.move_count(),
                             features.subspan(static_cast<size_t>(i) * board, board));
        summary_rows_[static_cast<size_t>(i)] = i * T;
    }
    program_->forward(nullptr, nullptr, batch_, T, 0, loss_scale, summary_rows_.data());
    backend_.synchronize();
    const float* policy = static_cast<const float*>(program_->tensor("policy", 0));
    const float* value = static_cast<const float*>(program_->tensor("value", 0));
    action_logits_.resize(static_cast<size_t>(n) * A);
    raw_values_.assign(value, value + n);
    for (int i = 0; i < n; ++i) {
        const games::Connect4& p = positions[static_cast<size_t>(i)];
        const uint64_t legal = p.legal_moves();
        for (int a = 0; a < A; ++a)
            action_logits_[static_cast<size_t>(i) * A + a] =
                (legal >> a & 1) ? policy[static_cast<int64_t>(i) * T + 1 + p.action_cell(a)]
                                 : -std::numeric_limits<float>::infinity();
    }
}

namespace {

// Softmax of one position's action logits (-inf: illegal) into out; returns log of the normaliser's sum after the
// max is taken out, with the max, so that log p_a = logit_a - max - log_sum.
std::pair<float, float> softmax(std::span<const float> logits, std::span<float> out) {
    float max = -std::numeric_limits<float>::infinity();
    for (float z : logits) max = std::max(max, z);
    MS_CHECK(std::isfinite(max), "PolicyValueNet: a position with no legal move");
    double sum = 0;
    for (size_t a = 0; a < logits.size(); ++a) {
        out[a] = std::exp(logits[a] - max);  // exp(-inf) = 0 for illegal moves
        sum += out[a];
    }
    for (float& p : out) p = static_cast<float>(p / sum);
    return {max, static_cast<float>(std::log(sum))};
}

}  // namespace

void PolicyValueNet::evaluate(std::span<const games::Connect4> positions, std::span<float> priors,
                              std::span<float> values) {
    const size_t n = positions.size();
    MS_CHECK(n >= 1 && values.size() == n, "PolicyValueNet::evaluate: {} positions, {} values", n, values.size());
    const size_t A = static_cast<size_t>(positions[0].num_actions());
    MS_CHECK(priors.size() == n * A, "PolicyValueNet::evaluate: {} priors for {} x {}", priors.size(), n, A);
    for (size_t first = 0; first < n; first += static_cast<size_t>(max_batch_)) {
        const size_t m = std::min(n - first, static_cast<size_t>(max_batch_));
        forward(positions.subspan(first, m), 0.0f);
        for (size_t i = 0; i < m; ++i) {
            softmax(std::span<const float>(action_logits_).subspan(i * A, A), priors.subspan((first + i) * A, A));
            values[first + i] = std::tanh(raw_values_[i]);
        }
    }
}

PolicyValueLoss PolicyValueNet::train_step(std::span<const games::Connect4> states, std::span<const float> policies,
                                           std::span<const float> outcomes) {
    const size_t b = states.size();
    MS_CHECK(b >= 1 && outcomes.size() == b, "PolicyValueNet::train_step: {} states, {} outcomes", b, outcomes.size());
    const size_t A = static_cast<size_t>(states[0].num_actions());
    MS_CHECK(policies.size() == b * A, "PolicyValueNet::train_step: {} policy values for {} x {}", policies.size(), b,
             A);
    backend_.zero(Tensor::f32(grads(), {padded_flat_size(flat_, groups_.dp->size())}));
    forward(states, 1.0f);
    const int T = rows_ * cols_ + 1;
    dpolicy_.assign(static_cast<size_t>(b) * T, 0.0f);
    dvalue_.resize(b);
    std::vector<float> p(A);
    double policy_loss = 0, value_loss = 0;
    const float inv_b = 1.0f / static_cast<float>(b);
    for (size_t i = 0; i < b; ++i) {
        const std::span<const float> logits = std::span<const float>(action_logits_).subspan(i * A, A);
        const std::span<const float> pi = policies.subspan(i * A, A);
        const auto [max, log_sum] = softmax(logits, p);
        for (size_t a = 0; a < A; ++a) {
            if (!std::isfinite(logits[a])) {
                MS_CHECK(pi[a] == 0.0f, "PolicyValueNet::train_step: visits on an illegal move");
                continue;
            }
            policy_loss -= static_cast<double>(pi[a]) * (logits[a] - max - log_sum);
            dpolicy_[i * T + 1 + static_cast<size_t>(states[i].action_cell(static_cast<int>(a)))] =
                (p[a] - pi[a]) * inv_b;
        }
        const float v = std::tanh(raw_values_[i]), err = v - outcomes[i];
        value_loss += static_cast<double>(err) * err;
        dvalue_[i] = 2.0f * err * (1.0f - v * v) * inv_b;
    }
    std::copy(dpolicy_.begin(), dpolicy_.end(), static_cast<float*>(program_->gradient("policy", 0)));
    std::copy(dvalue_.begin(), dvalue_.end(), static_cast<float*>(program_->gradient("value", 0)));
    program_->backward(0);
    program_->finish_gradients();
    backend_.synchronize();
    PolicyValueLoss loss;
    loss.policy_loss = static_cast<float>(policy_loss / static_cast<double>(b));
    loss.value_loss = static_cast<float>(value_loss / static_cast<double>(b));
    loss.loss = loss.policy_loss + loss.value_loss;
    return loss;
}

}  // namespace ms::selfplay
