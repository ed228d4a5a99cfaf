// selfplay_train.h: `mindspeed-train selfplay`: AlphaZero-style training of the policy-value network on its own
// games (docs/selfplay.md). Each iteration, on every data-parallel rank: play this rank's self-play groups with the
// batched tree search, gather every rank's positions into the (replicated) replay buffer, take selfplay.train_steps
// optimizer steps on positions drawn from it (gradients averaged over dp, so the weights stay identical), and every
// eval_interval iterations play evaluation matches, which may advance the curriculum. Checkpoints hold the network,
// the optimizer, the replay buffer and the curriculum stage, and resume exactly.
#pragma once

#include "engine/config/config.h"

namespace ms::selfplay {

int run_selfplay(const Config& cfg);

}  // namespace ms::selfplay
