// arena.h: evaluation matches of Connect Four between two players: the agent (a tree search over an evaluator, no
// root noise, the most visited move), alpha-beta to a depth, and the random player; any two of them.
//
// All games of a match advance together, one move of every unfinished game per step: the games where a searching
// player is to move join one BatchedSearch (mcts.h) of that player per step, so its network sees big batches.
// `player` moves first in the even-numbered games and second in the odd ones, and the tallies are its results.
// A simple player's draws come from a seed per (match seed, game, side), so games differ and replay exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/games/connect4.h"
#include "engine/selfplay/evaluator.h"
#include "engine/selfplay/mcts.h"

namespace ms::selfplay {

enum class PlayerKind : uint8_t { kRandom, kAlphaBeta, kAgent };

struct Player {
    PlayerKind kind = PlayerKind::kRandom;
    int depth = 0;                                    // kAlphaBeta: plies before its heuristic; <= 0 a full solve
    Evaluator<games::Connect4>* evaluator = nullptr;  // kAgent
    MctsOptions mcts;                                 // kAgent: noise_fraction is 0

    static Player random() { return {}; }
    static Player alpha_beta(int depth) { return {PlayerKind::kAlphaBeta, depth, nullptr, {}}; }
    // The agent, for evaluation: the options as given but PUCT at the root, without noise.
    static Player agent(Evaluator<games::Connect4>& evaluator, MctsOptions options) {
        options.noise_fraction = 0.0f;
        options.root = RootSelection::kPuct;
        return {PlayerKind::kAgent, 0, &evaluator, options};
    }
    // "random", "alpha-beta depth 4", "alpha-beta solver", "mcts 200 simulations": for logs.
    std::string name() const;
};

// Results from one player's view.
struct Tally {
    int wins = 0, draws = 0, losses = 0;
    int games() const { return wins + draws + losses; }
    Tally& operator+=(const Tally& other) {
        wins += other.wins;
        draws += other.draws;
        losses += other.losses;
        return *this;
    }
    friend Tally operator+(Tally a, const Tally& b) { return a += b; }
};

struct MatchResult {
    Tally total;
    Tally as_first;                  // the games `player` moved first in (the even-numbered ones)
    Tally as_second;                 // and second
    int distinct_games = 0;          // different move sequences among the games
    std::vector<std::string> moves;  // per game, its moves in Pons' notation (1-based column digits)
    SearchCounters search;           // both players' searches together
};

// `game_count` games of `player` against `opponent` on a rows x cols board. Throws UserError for a board Connect
// Four cannot be played on, game_count < 1, or search options out of range.
// opening_moves: the first plies of every game are random moves, the same for games 2i and 2i + 1 (paired openings:
// each opening is played once with each colour), so that deterministic players meet in varied positions and a
// match measures more than the one or two lines two such players would otherwise repeat.
// games: the match's games [begin, end) alone (end < 0: to game_count), each played exactly as in the whole match,
// so that ranks can share a match: the tallies, moves and counters are of those games.
// The number of different move sequences among `moves`: MatchResult::distinct_games.
int count_distinct(const std::vector<std::string>& moves);

struct GameRange {
    int begin = 0, end = -1;
};
MatchResult play_match(const Player& player, const Player& opponent, int rows, int cols, int game_count, uint64_t seed,
                       int opening_moves = 0, GameRange games = {});

}  // namespace ms::selfplay
