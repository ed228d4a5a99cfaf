// self_play.cpp: move choice from visit counts, and self-play games advanced together (self_play.h).
#include "engine/selfplay/self_play.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "engine/core/check.h"
#include "engine/core/philox.h"

namespace ms::selfplay {

namespace {

constexpr int kMaxTemperatureMoves = 1 << 16;

// A game in progress, and what it keeps.
struct GameInProgress {
    games::Connect4 state;
    std::vector<TrainingPosition<games::Connect4>> positions;
    std::vector<float> search_values;  // per position, its search's root value
    std::string moves;
};

// The actions a move may be chosen among: those the search proved won, if any; else those not proven lost, if any;
// else every action (a lost position still has to move). Bit a: action a.
uint64_t candidates(const RootResult& result) {
    uint64_t won = 0, open = 0, visited = 0;
    for (size_t a = 0; a < result.visits.size(); ++a) {
        if (result.visits[a] == 0 && result.proven[a] <= 0) continue;
        visited |= uint64_t{1} << a;
        if (result.proven[a] > 0) won |= uint64_t{1} << a;
        if (result.proven[a] == 0) open |= uint64_t{1} << a;
    }
    return won != 0 ? won : open != 0 ? open : visited;
}

}  // namespace

int most_visited(const RootResult& result) {
    const uint64_t allowed = candidates(result);
    int best = -1;
    for (int a = 0; a < static_cast<int>(result.visits.size()); ++a) {
        if (!(allowed >> a & 1)) continue;
        if (best < 0 || result.visits[a] > result.visits[best] ||
            (result.visits[a] == result.visits[best] && result.priors[a] > result.priors[best])) {
            best = a;
        }
    }
    MS_CHECK(best >= 0, "most_visited of a search result without visits");
    return best;
}

int sample_by_visits(const RootResult& result, uint64_t seed, uint64_t game, int move) {
    const uint64_t allowed = candidates(result);
    int64_t total = 0;
    for (int a = 0; a < static_cast<int>(result.visits.size()); ++a) total += (allowed >> a & 1) ? result.visits[a] : 0;
    if (total == 0) return most_visited(result);  // a proven win no simulation went through yet
    const double u = philox_uniform_double(seed, game, draw_index(move, DrawPurpose::kTemperature, 0));
    int64_t pick = std::min(total - 1, static_cast<int64_t>(u * static_cast<double>(total)));
    for (int a = 0; a < static_cast<int>(result.visits.size()); ++a) {
        if (!(allowed >> a & 1)) continue;
        if (pick < result.visits[a]) return a;
        pick -= result.visits[a];
    }
    MS_UNREACHABLE("sample_by_visits walked past {} visits", total);
}

int choose_move(const RootResult& result, int temperature_moves, uint64_t seed, uint64_t game, int move) {
    if (result.chosen >= 0) return result.chosen;
    return move < temperature_moves ? sample_by_visits(result, seed, game, move) : most_visited(result);
}

void check_self_play_options(const SelfPlayOptions& options) {
    check_mcts_options(options.mcts);
    if (!(options.value_from_search >= 0.0f && options.value_from_search <= 1.0f)) {
        throw UserError(
            fmt::format("config error: selfplay.value_from_search = {} must be in [0, 1]", options.value_from_search));
    }
    if (options.temperature_moves < 0 || options.temperature_moves > kMaxTemperatureMoves) {
        throw UserError(fmt::format("config error: selfplay.temperature_moves = {} must be in [0, {}]",
                                    options.temperature_moves, kMaxTemperatureMoves));
    }
    if (!(options.full_search_fraction > 0.0f && options.full_search_fraction <= 1.0f)) {
        throw UserError(fmt::format(
            "config error: selfplay.full_search_fraction = {} must be in (0, 1]; hint: 1 makes every search a full "
            "one (no playout-cap randomisation)",
            options.full_search_fraction));
    }
    if (options.full_search_fraction < 1.0f &&
        (options.fast_simulations < 1 || options.fast_simulations >= options.mcts.simulations)) {
        throw UserError(
            fmt::format("config error: selfplay.fast_simulations = {} must be at least 1 and fewer than the stage's {} "
                        "simulations when selfplay.full_search_fraction ({}) is below 1",
                        options.fast_simulations, options.mcts.simulations, options.full_search_fraction));
    }
}

bool full_search(const SelfPlayOptions& options, uint64_t seed, uint64_t game, int move) {
    return options.full_search_fraction >= 1.0f ||
           philox_uniform_double(seed, game, draw_index(move, DrawPurpose::kPlayoutCap, 0)) <
               options.full_search_fraction;
}

SelfPlayGames play_games(Evaluator<games::Connect4>& evaluator, int rows, int cols, const SelfPlayOptions& options,
                         uint64_t seed, uint64_t first_game, int count) {
    check_self_play_options(options);
    MS_CHECK(count >= 0, "play_games of {} games", count);
    std::vector<GameInProgress> in_progress(count, GameInProgress{games::Connect4::empty(rows, cols), {}, {}, {}});
    BatchedSearch<games::Connect4> search(options.mcts, seed);

    // One move of every unfinished game per step, their searches batched together.
    std::vector<SearchRoot<games::Connect4>> roots;
    std::vector<size_t> playing;  // the game of each root
    for (;;) {
        roots.clear();
        playing.clear();
        for (size_t g = 0; g < in_progress.size(); ++g) {
            if (in_progress[g].state.outcome() != games::Outcome::kOngoing) continue;
            const uint64_t game = first_game + g;
            const bool full = full_search(options, seed, game, in_progress[g].state.move_count());
            roots.push_back({.state = in_progress[g].state,
                             .game = game,
                             .simulations = full ? 0 : options.fast_simulations,
                             .noise = full});
            playing.push_back(g);
        }
        if (roots.empty()) break;
        const std::vector<RootResult> results = search.run(evaluator, roots);
        for (size_t i = 0; i < playing.size(); ++i) {
            GameInProgress& game = in_progress[playing[i]];
            const int move = game.state.move_count();
            if (roots[i].noise) {  // a full search
                game.positions.push_back({game.state, results[i].policy, 0.0f});
                game.search_values.push_back(results[i].value);
            }
            const int action = choose_move(results[i], options.temperature_moves, seed, roots[i].game, move);
            game.state.play(action);
            game.moves += static_cast<char>('1' + action);
        }
    }

    SelfPlayGames out;
    SelfPlayStats& stats = out.stats;
    for (GameInProgress& game : in_progress) {
        // A finished game's side to move has lost or drawn: the winner, if any, is the side that moved last.
        const bool drawn = game.state.outcome() == games::Outcome::kDraw;
        const int winner_parity = (game.state.move_count() - 1) & 1;
        const float w = options.value_from_search;
        for (size_t i = 0; i < game.positions.size(); ++i) {
            TrainingPosition<games::Connect4>& p = game.positions[i];
            const float z = drawn ? 0.0f : (p.state.move_count() & 1) == winner_parity ? 1.0f : -1.0f;
            p.value = (1.0f - w) * z + w * game.search_values[i];
        }
        stats.draws += drawn;
        stats.first_player_wins += !drawn && winner_parity == 0;
        stats.second_player_wins += !drawn && winner_parity == 1;
        stats.moves += game.state.move_count();
        stats.positions += static_cast<int64_t>(game.positions.size());
        out.positions.insert(out.positions.end(), std::make_move_iterator(game.positions.begin()),
                             std::make_move_iterator(game.positions.end()));
        out.moves.push_back(std::move(game.moves));
    }
    stats.games = count;
    stats.positions_evaluated = search.counters().positions_evaluated;
    stats.evaluate_calls = search.counters().evaluate_calls;
    stats.mean_game_length = count > 0 ? static_cast<double>(stats.moves) / count : 0.0;
    return out;
}

}  // namespace ms::selfplay
