// self_play.h: self-play games of Connect Four (games::Connect4 only: the one game there is), all advanced together
// through one batched tree search (mcts.h) per move step, and how a move is chosen from a search's visit counts.
//
// Games are indexed globally: game g's draws (root noise, move sampling) are Philox of (seed, g, move number), so
// play_games(first_game = 0, count = 4) equals play_games(0, 2) followed by play_games(2, 2) exactly, which is how
// data-parallel ranks split a step's games.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/games/connect4.h"
#include "engine/selfplay/evaluator.h"
#include "engine/selfplay/mcts.h"

namespace ms::selfplay {

// Moves are chosen among the actions the search proved won, if any, else among those it did not prove lost (all,
// when every action is).
// The most visited of them; ties: the higher prior (the one the search used), then the lower action.
int most_visited(const RootResult& result);
// One of them drawn with probability proportional to its visits (temperature 1), from (seed, game, move).
int sample_by_visits(const RootResult& result, uint64_t seed, uint64_t game, int move);
// The self-play move: the search's own (RootResult::chosen, Gumbel root selection's), else sample_by_visits for the
// first `temperature_moves` moves of a game (move < temperature_moves), most_visited after.
int choose_move(const RootResult& result, int temperature_moves, uint64_t seed, uint64_t game, int move);

struct SelfPlayOptions {
    MctsOptions mcts;
    int temperature_moves = 8;  // the moves of a game sampled from the visits; the rest take the most visited
    // w: a position's value target is (1 - w) z + w q, z the game's outcome and q the root value of the position's
    // search, both for the side to move (the average of the two, w = 1/2, learns faster than z alone: z is one
    // noisy sample of the position's value, and q depends on the moves the game did not play).
    float value_from_search = 0.0f;
    // Playout-cap randomisation (KataGo; Wu, "Accelerating Self-Play Learning in Go", 2019): with
    // full_search_fraction < 1, each move's search is a full one (mcts.simulations, the root noise) with that
    // probability, drawn from (seed, game, move), and otherwise a fast one of fast_simulations without noise. Only the
    // full searches' positions are kept: their policy targets come from a full search, and the fast moves finish more
    // games, hence more value targets, for the same simulations.
    float full_search_fraction = 1.0f;
    int fast_simulations = 0;
};

// Throws UserError, naming the key, its value and the allowed range, for an option out of range (the search's
// included).
void check_self_play_options(const SelfPlayOptions& options);

// Whether move `move` of game `game` is a full search (always, without playout-cap randomisation).
bool full_search(const SelfPlayOptions& options, uint64_t seed, uint64_t game, int move);

struct SelfPlayStats {
    int64_t games = 0;
    int64_t moves = 0;
    int64_t positions = 0;  // kept: every move's, or with playout-cap randomisation the full searches'
    int64_t first_player_wins = 0;
    int64_t second_player_wins = 0;
    int64_t draws = 0;
    int64_t positions_evaluated = 0;  // rows sent to the evaluator
    int64_t evaluate_calls = 0;
    double mean_game_length = 0.0;  // moves / games

    // The stats of both sets of games together.
    SelfPlayStats& operator+=(const SelfPlayStats& other) {
        games += other.games;
        moves += other.moves;
        positions += other.positions;
        first_player_wins += other.first_player_wins;
        second_player_wins += other.second_player_wins;
        draws += other.draws;
        positions_evaluated += other.positions_evaluated;
        evaluate_calls += other.evaluate_calls;
        mean_game_length = games > 0 ? static_cast<double>(moves) / static_cast<double>(games) : 0.0;
        return *this;
    }
};

struct SelfPlayGames {
    // Every position kept of every game, in game order then move order: the state, the search's policy (RootResult),
    // and the value target for the side to move there: the game's outcome (+1 won, 0 drawn, -1 lost), mixed with the
    // search's root value by SelfPlayOptions::value_from_search.
    std::vector<TrainingPosition<games::Connect4>> positions;
    std::vector<std::string> moves;  // per game, its moves in Pons' notation (1-based column digits)
    SelfPlayStats stats;
};

// Games [first_game, first_game + count) on a rows x cols board, each from the empty board to its end. Throws
// UserError for a board Connect Four cannot be played on or options out of range.
SelfPlayGames play_games(Evaluator<games::Connect4>& evaluator, int rows, int cols, const SelfPlayOptions& options,
                         uint64_t seed, uint64_t first_game, int count);

}  // namespace ms::selfplay
