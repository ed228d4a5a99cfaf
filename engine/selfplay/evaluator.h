// evaluator.h: what a tree search asks of a policy/value network, and what self-play keeps of a game to learn from.
//
// The search (mcts.h) never sees the network: it hands batches of leaf positions to an Evaluator and gets back, per
// position, a prior over the actions and a value. The network (policy_value_net.h) is one Evaluator; tests use
// others (uniform priors, exact values from a solver).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/games/game.h"

namespace ms::selfplay {

template <games::Game G>
class Evaluator {
  public:
    virtual ~Evaluator() = default;
    // positions: n >= 1 positions of one board size, none of them over. Writes priors (n x num_actions, row-major:
    // each row a distribution over that position's legal moves, 0 on the illegal ones) and values (n: the side to
    // move's expected outcome, in [-1, 1]). A position's result must not depend on the others in the batch.
    virtual void evaluate(std::span<const G> positions, std::span<float> priors, std::span<float> values) = 0;
    // The most positions one evaluate() call takes.
    virtual int max_batch() const = 0;
};

// One position a self-play game passed through, as the network learns from it: the state (the side to move's view),
// the search's policy over the actions (RootResult::policy: num_actions values summing to 1), and the value target for
// the side to move then: the game's final outcome (+1 won, 0 drawn, -1 lost), or that mixed with the search's value
// (SelfPlayOptions::value_from_search).
template <games::Game G>
struct TrainingPosition {
    G state;
    std::vector<float> policy;
    float value = 0.0f;
};

}  // namespace ms::selfplay
