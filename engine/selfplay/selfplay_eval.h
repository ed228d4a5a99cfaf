// selfplay_eval.h: the evaluation matches of a self-play agent -- the trainer's periodic and final ones
// (selfplay_train.cpp) and `mindspeed-train eval` of a self-play checkpoint -- and what a self-play checkpoint holds
// besides the network and the optimizer.
//
// `eval` of the final checkpoint with the run's config plays exactly the run's final evaluation (the same seed per
// iteration, the same opponents, games and search); --set selfplay.final_eval_simulations=N (or _games) plays it
// at another budget without training again.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/process_groups.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/config/config.h"
#include "engine/selfplay/arena.h"
#include "engine/selfplay/policy_value_net.h"
#include "engine/selfplay/selfplay_layout.h"

namespace ms::selfplay {

// A checkpoint's files that are self-play's own, beside the network and the optimizer: the curriculum stage (and the
// game) as JSON, and the replay buffer (ReplayBuffer::save).
inline constexpr const char* kStateFile = "selfplay_state.json";
inline constexpr const char* kReplayFile = "selfplay_replay.bin";

// The network's tensors and manifest, as the trainer saves them and `eval` checks them.
CheckpointModel selfplay_checkpoint_model(const GptShape& shape);

// The curriculum stage (0-based) that checkpoint directory `dir` was saved at, of `stages` stages. UserError naming
// the file when it is missing (not a self-play checkpoint), not a stage record, or past the curriculum.
int read_checkpoint_stage(const std::string& dir, int stages);

struct Evaluation {
    std::string opponent;  // as configured: "alphabeta:4"
    MatchResult match;
    double score() const;  // (wins + draws / 2) / games
};

// The agent against each of the stage's opponents (and promote_against, when it is not among them and there is a
// curriculum to advance), each match's games shared by the data-parallel ranks of `groups` and gathered, so every
// rank returns the whole matches. `it` seeds the matches; `final` picks the final evaluation's games and search.
std::vector<Evaluation> evaluate(const Config& cfg, const SelfPlayLayout& l, const ProcessGroups& groups,
                                 const Stage& stage, PolicyValueNet& net, int64_t it, bool final);

// Logs one line per match after `prefix` (" iteration    48/  145 |"): "evaluation on 6 x 7 vs alphabeta:4: won 113,
// drew 22, lost 65 of 200 (score 0.620; first 50/100, second 63/100 won; 167 distinct games)". Returns the round's
// metrics record: iteration, stage (1-based), board, simulations, and per opponent "vs <spec>" its wins, draws,
// losses, win rate, score and distinct games.
nlohmann::json log_evaluations(const std::vector<Evaluation>& evals, const std::string& prefix, int64_t it,
                               int stage_index, const Stage& stage, int simulations);

// `mindspeed-train eval` of a self-play checkpoint: the network read from `reader` (whose model must be the
// config's), on the board of the curriculum stage it was saved at, plays the final evaluation (selfplay.
// final_eval_games against each of selfplay.eval_opponents at final_eval_simulations) on one rank. Returns the
// record the trainer writes to metrics.jsonl for a final evaluation, with "checkpoint" added.
nlohmann::json run_selfplay_eval(Config cfg, const CheckpointReader& reader, const std::string& config_name);

}  // namespace ms::selfplay
