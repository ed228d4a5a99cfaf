// selfplay_layout.cpp: a model.arch: alphazero run checked and resolved once (selfplay_layout.h).
#include "engine/selfplay/selfplay_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <string_view>

#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/games/game.h"
#include "engine/model/policy_value.h"

namespace ms::selfplay {
namespace {

[[noreturn]] void refuse(const std::string& msg) { throw UserError("config error: " + msg); }

bool parse_int(std::string_view s, int& out) {
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && end == s.data() + s.size();
}

// "<rows>x<cols>" of `key`, checked as a board of the game.
void parse_board(const std::string& key, std::string_view text, const std::string& game, int& rows, int& cols) {
    const size_t x = text.find('x');
    if (x == std::string_view::npos || !parse_int(text.substr(0, x), rows) || !parse_int(text.substr(x + 1), cols))
        refuse(fmt::format("{}: '{}' is not a board; write it as <rows>x<cols>, e.g. 6x7", key, text));
    try {
        games::game_spec(game, rows, cols);
    } catch (const UserError& e) {
        refuse(fmt::format("{}: {}", key, e.what()));
    }
}

Opponent parse_opponent(const std::string& key, const std::string& spec) {
    if (spec == "random") return {spec, Player::random()};
    int depth = 0;
    if (spec.starts_with("alphabeta:") && parse_int(std::string_view(spec).substr(10), depth) && depth >= 1)
        return {spec, Player::alpha_beta(depth)};
    refuse(
        fmt::format("{}: unknown opponent '{}'; the opponents are random and alphabeta:<depth> (depth >= 1, e.g. "
                    "alphabeta:4)",
                    key, spec));
}

}  // namespace

std::string Stage::name() const { return fmt::format("{} x {}, {} simulations", rows, cols, simulations); }

SelfPlayOptions SelfPlayLayout::play_options(const Config& cfg, int s) const {
    const SelfPlayConfig& c = cfg.selfplay;
    SelfPlayOptions o;
    o.mcts.simulations = stages.at(static_cast<size_t>(s)).simulations;
    o.mcts.c_puct = c.c_puct;
    o.mcts.dirichlet_alpha = c.dirichlet_alpha;
    o.mcts.root = c.search == "gumbel" ? RootSelection::kGumbel : RootSelection::kPuct;
    o.mcts.noise_fraction = o.mcts.root == RootSelection::kGumbel ? 0.0f : c.noise_fraction;
    o.mcts.leaves_per_wave = c.leaves_per_wave;
    o.mcts.virtual_loss = c.virtual_loss;
    o.mcts.reuse_tree = c.reuse_tree;
    o.temperature_moves = c.temperature_moves;
    o.value_from_search = c.value_from_search;
    o.full_search_fraction = c.full_search_fraction;
    o.fast_simulations = c.fast_simulations;
    return o;
}

MctsOptions SelfPlayLayout::eval_options(const Config& cfg, bool final) const {
    const SelfPlayConfig& c = cfg.selfplay;
    MctsOptions o = play_options(cfg, 0).mcts;
    o.simulations = final && c.final_eval_simulations > 0 ? c.final_eval_simulations : c.eval_simulations;
    o.noise_fraction = 0.0f;
    return o;
}

int SelfPlayLayout::eval_games(const Config& cfg, bool final) const {
    const SelfPlayConfig& c = cfg.selfplay;
    return final && c.final_eval_games > 0 ? c.final_eval_games : c.eval_games;
}

SelfPlayLayout selfplay_layout(const Config& cfg, int world_size) {
    const SelfPlayConfig& c = cfg.selfplay;
    if (cfg.model.arch != "alphazero")
        refuse(
            fmt::format("selfplay trains model.arch: alphazero (this config has model.arch: {}); hint: set "
                        "model.arch: alphazero and a selfplay: section, or run `mindspeed-train train` for this "
                        "model",
                        cfg.model.arch));
    if (cfg.run.backend != "cpu")
        refuse(
            "model.arch: alphazero runs on run.backend: cpu (the search reads the network's outputs on the host); "
            "hint: set run.backend: cpu");
    if (cfg.mixed_precision.dtype != "fp32")
        refuse(
            fmt::format("model.arch: alphazero trains in fp32 (mixed_precision.dtype is {}); hint: set "
                        "mixed_precision.dtype: fp32",
                        cfg.mixed_precision.dtype));
    if (cfg.parallel.pipeline_model_parallel_size != 1 || cfg.parallel.context_parallel_size != 1 ||
        cfg.parallel.sequence_parallel)
        refuse(
            "model.arch: alphazero runs tensor and data parallel only: set parallel.pipeline_model_parallel_size: "
            "1, parallel.context_parallel_size: 1 and parallel.sequence_parallel: false");
    SelfPlayLayout l;
    if (c.curriculum.empty()) refuse("selfplay.curriculum is empty; hint: give at least one stage, e.g. [\"6x7:64\"]");
    for (size_t i = 0; i < c.curriculum.size(); ++i) {
        const std::string key = fmt::format("selfplay.curriculum[{}]", i);
        const std::string& text = c.curriculum[i];
        const size_t colon = text.find(':');
        Stage s;
        if (colon == std::string::npos || !parse_int(std::string_view(text).substr(colon + 1), s.simulations) ||
            s.simulations < 1)
            refuse(fmt::format("{}: '{}' is not a stage; write it as <rows>x<cols>:<simulations per move>, e.g. 6x7:64",
                               key, text));
        parse_board(key, std::string_view(text).substr(0, colon), c.game, s.rows, s.cols);
        if (!l.stages.empty()) {
            const Stage& p = l.stages.back();
            if (s.rows < p.rows || s.cols < p.cols || (s.rows == p.rows && s.cols == p.cols))
                refuse(
                    fmt::format("selfplay.curriculum: stage {} ({} x {}) does not grow from stage {} ({} x {}): each "
                                "stage's board must have at least the rows and columns of the one before, and more "
                                "of one",
                                i + 1, s.rows, s.cols, i, p.rows, p.cols));
        }
        l.stages.push_back(s);
    }
    int max_rows = l.stages.back().rows, max_cols = l.stages.back().cols;
    if (!c.max_board.empty()) {
        parse_board("selfplay.max_board", c.max_board, c.game, max_rows, max_cols);
        for (const Stage& s : l.stages)
            if (s.rows > max_rows || s.cols > max_cols)
                refuse(
                    fmt::format("selfplay.curriculum: the network cannot embed a {} x {} board "
                                "(selfplay.max_board is {}); hint: raise selfplay.max_board or leave it empty for the "
                                "curriculum's largest board",
                                s.rows, s.cols, c.max_board));
    }
    const ModelConfig& m = cfg.model;
    l.shape = policy_value_shape({.layers = m.num_layers,
                                  .hidden = m.hidden_size,
                                  .heads = m.num_attention_heads,
                                  .ffn = m.ffn_hidden_size > 0 ? m.ffn_hidden_size : 4 * m.hidden_size,
                                  .board_rows = max_rows,
                                  .board_cols = max_cols,
                                  .eps = m.layernorm_epsilon,
                                  .threat_features = c.threat_features});
    if (m.hidden_size % m.num_attention_heads != 0)
        refuse(fmt::format("model.hidden_size {} is not a multiple of model.num_attention_heads {}", m.hidden_size,
                           m.num_attention_heads));
    l.tp = cfg.parallel.tensor_model_parallel_size;
    if (world_size % l.tp != 0)
        refuse(fmt::format("the world size {} is not a multiple of parallel.tensor_model_parallel_size {}", world_size,
                           l.tp));
    if (m.num_attention_heads % l.tp != 0 || l.shape.F % l.tp != 0)
        refuse(
            fmt::format("parallel.tensor_model_parallel_size {} must divide model.num_attention_heads {} and the "
                        "ffn width {}",
                        l.tp, m.num_attention_heads, l.shape.F));
    l.dp = world_size / l.tp;
    const int64_t per_rank = c.games_per_iteration / l.dp;
    if (c.games_per_iteration % (int64_t{l.dp} * c.games_per_group) != 0)
        refuse(
            fmt::format("selfplay.games_per_iteration {} must be a multiple of selfplay.games_per_group {} times the "
                        "{} data-parallel ranks: every rank plays whole groups",
                        c.games_per_iteration, c.games_per_group, l.dp));
    l.groups_per_rank = static_cast<int>(per_rank / c.games_per_group);
    const int64_t global = cfg.training.global_batch_size;
    if (global < 1 || global % l.dp != 0)
        refuse(fmt::format("training.global_batch_size {} must be a positive multiple of the {} data-parallel ranks",
                           global, l.dp));
    l.b = static_cast<int>(global / l.dp);
    l.max_batch = std::max(l.b, c.games_per_group * c.leaves_per_wave);
    for (size_t i = 0; i < c.eval_opponents.size(); ++i)
        l.eval_opponents.push_back(parse_opponent(fmt::format("selfplay.eval_opponents[{}]", i), c.eval_opponents[i]));
    l.promote_against = parse_opponent("selfplay.promote_against", c.promote_against);
    for (size_t s = 0; s < l.stages.size(); ++s) check_self_play_options(l.play_options(cfg, static_cast<int>(s)));
    return l;
}

void log_selfplay_layout(const Config& cfg, const SelfPlayLayout& l) {
    std::string stages;
    for (const Stage& s : l.stages) stages += (stages.empty() ? "" : "; ") + s.name();
    log_info("selfplay: {} | network: {} layers, hidden {}, {} heads, ffn {}, boards up to {} x {}{} | tp {} x dp {}",
             cfg.selfplay.game, l.shape.L, l.shape.C, l.shape.NH, l.shape.F, l.shape.board_rows, l.shape.board_cols,
             l.shape.threat_features ? ", threat features" : "", l.tp, l.dp);
    log_info(
        "selfplay: curriculum {} | {} games per iteration in groups of {} | {} steps of {} positions per "
        "iteration",
        stages, cfg.selfplay.games_per_iteration, cfg.selfplay.games_per_group, cfg.selfplay.train_steps,
        cfg.training.global_batch_size);
}

}  // namespace ms::selfplay
