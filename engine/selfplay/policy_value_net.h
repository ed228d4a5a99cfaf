// policy_value_net.h: the self-play network (engine/model/policy_value.h, one chunk run by GptProgram) as the search's
// Evaluator of Connect Four positions, and its training step on (position, visit distribution, outcome) samples.
//
// Parameters: one flat fp32 buffer (policy_value_param_table's layout) and its gradients, which the distributed
// optimizer steps (its weight decay is AlphaZero's L2 term). Tensor-parallel ranks hold their shards of the trunk
// and whole copies of the rest, and compute the same outputs.
//
// Evaluation: positions go through the network in chunks of at most max_batch(), each chunk padded up to the next of
// a multiple of 8 so that the number of compiled programs stays small; a position's
// outputs do not depend on the others in its batch (every op works per row or per board), which the evaluator's
// contract (evaluator.h) asks and a test checks.
//
// Loss of a sample (AlphaZero's, weight decay apart): the cross-entropy between the search's visit distribution pi
// and the softmax of the legal moves' logits, plus (tanh(value) - z)^2 against the outcome z; the step's loss is the
// mean over this rank's samples (and the optimizer's average over data-parallel ranks makes it the global batch's).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "comm/process_groups.h"
#include "engine/backends/backend.h"
#include "engine/games/connect4.h"
#include "engine/model/gpt_graph.h"
#include "engine/selfplay/evaluator.h"
#include "memory/memory_block.h"

namespace ms::selfplay {

struct PolicyValueLoss {
    float loss = 0.0f;         // policy + value
    float policy_loss = 0.0f;  // cross-entropy against the visit distributions
    float value_loss = 0.0f;   // squared error of tanh(value) against the outcomes
};

class PolicyValueNet final : public Evaluator<games::Connect4> {
  public:
    // max_batch: the most positions one forward takes (evaluation chunks and training batches alike). groups: tp and
    // dp (pp and cp of 1).
    PolicyValueNet(const GptShape& shape, Backend& backend, const ProcessGroups& groups, int max_batch);
    ~PolicyValueNet() override;

    const GptShape& shape() const { return shape_; }
    const std::vector<ParamInfo>& params_info() const { return table_; }
    int64_t flat_size() const { return flat_; }
    float* params() { return params_.as<float>(); }
    float* grads() { return grads_.as<float>(); }
    void init_weights(uint64_t seed, float init_std);

    // Throws UserError, with a sentence, for a board larger than the network embeds.
    void check_board(int rows, int cols) const;

    void evaluate(std::span<const games::Connect4> positions, std::span<float> priors,
                  std::span<float> values) override;
    int max_batch() const override { return max_batch_; }

    // Forward and backward of b = states.size() samples (b <= max_batch(), one board size): policies (b x
    // num_actions) the visit distributions, outcomes (b) in [-1, 1]. Gradients into grads() (zeroed first). Returns
    // this rank's mean loss.
    PolicyValueLoss train_step(std::span<const games::Connect4> states, std::span<const float> policies,
                               std::span<const float> outcomes);

  private:
    // The network's forward on positions (n <= max_batch), padded to a compiled batch size; loss_scale 0: no backward
    // follows. Leaves the logits of each position's actions in action_logits_ (n x num_actions, -inf for illegal
    // ones) and the values before the tanh in raw_values_ (n).
    void forward(std::span<const games::Connect4> positions, float loss_scale);

    GptShape shape_;
    Backend& backend_;
    const ProcessGroups& groups_;
    int max_batch_;
    std::vector<ParamInfo> table_;
    int64_t flat_ = 0;
    MemoryBlock params_, grads_;
    graph::GradPlacement grad_placement_;
    std::unique_ptr<GptProgram> program_;
    int batch_ = 0, rows_ = 0, cols_ = 0;  // of the last forward (batch_: padded)
    std::vector<int32_t> summary_rows_;    // (batch) b * T
    std::vector<float> policy_out_, value_out_, action_logits_, raw_values_;
    std::vector<float> dpolicy_, dvalue_;
    std::vector<int8_t> cells_, flags_;
};

}  // namespace ms::selfplay
