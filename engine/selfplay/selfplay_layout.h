// selfplay_layout.h: what a model.arch: alphazero run is, checked once from the config and the world size: the
// network's shape, the curriculum's stages, the tensor x data parallel split, the games and positions per rank, and
// the evaluation opponents. `selfplay` starts here; every refusal is a UserError with a sentence.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/model/gpt.h"
#include "engine/selfplay/arena.h"
#include "engine/selfplay/self_play.h"

namespace ms::selfplay {

// One curriculum stage: a board and the search's budget on it.
struct Stage {
    int rows = 6, cols = 7;
    int simulations = 64;
    std::string name() const;  // "6 x 7, 64 simulations"
};

struct Opponent {
    std::string spec;  // as configured: "random", "alphabeta:4"
    Player player;
};

struct SelfPlayLayout {
    GptShape shape;  // the network (engine/model/policy_value.h)
    std::vector<Stage> stages;
    int tp = 1, dp = 1;
    int groups_per_rank = 1;  // self-play groups (games_per_group games each) per data-parallel rank and iteration
    int b = 1;                // training positions per rank and optimizer step: global_batch_size / dp
    int max_batch = 1;        // the network's largest forward: a training batch or a group's wave of leaves
    std::vector<Opponent> eval_opponents;
    Opponent promote_against;
    // The self-play options of stage s: the config's search with the stage's simulations.
    SelfPlayOptions play_options(const Config& cfg, int s) const;
    // The evaluation agent's search, and the games per opponent: the final evaluation's when `final`.
    MctsOptions eval_options(const Config& cfg, bool final) const;
    int eval_games(const Config& cfg, bool final) const;
};

SelfPlayLayout selfplay_layout(const Config& cfg, int world_size);
void log_selfplay_layout(const Config& cfg, const SelfPlayLayout& l);

}  // namespace ms::selfplay
