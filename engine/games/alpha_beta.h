// alpha_beta.h: a negamax alpha-beta search of Connect Four (connect4.h), the evaluation opponent: a full solve, or
// depth-limited with a heuristic at the leaves. The solver's ideas are Pascal Pons' (his Connect Four solver
// tutorial): bitboard threat sets, only non-losing moves searched, score bounds from the move count, moves ordered
// by the threats they create, then centre first.
//
// Scores, from the side to move's view (one scale for solved and heuristic values, so a search can compare them):
//   kWinScore + p     a forced win, p >= 1 (Pons' score) one more than the number of stones the winner still
//                     holds after the winning move: the sooner the win, the higher;
//   -(kWinScore + p)  a forced loss, the same p for the winner: the later the loss, the higher;
//   0                 a draw (solved), or a level heuristic;
//   |s| < kWinScore   a heuristic (depth-limited search only): open lines of four, weighted by how many stones of
//                     one side, and of no other, they hold.
// A depth-limited search proves the wins and losses it reports: heuristics never reach kWinScore, so a score past it
// is a line the search followed to the end. A full solve's scores are all exact.
//
// Each search starts from an empty transposition table (a generation count, not a clear, marks older entries
// stale), so its result depends on its inputs alone; within one search a position is always reached with the same
// remaining depth (the depth left is the root's depth minus the stones added), so an entry never mixes depths. The
// table is fixed-size, 16-byte entries, one per slot, each keeping the full position key.
//
// Ties: the root scores every move exactly where it could be best (a window just below the best so far), so
// SearchResult::best_moves is every move of the best score. TieBreak::kCentre plays the one nearest the centre
// (the left one of two as near), kRandom one drawn from (seed, position): variety for evaluation games that stays
// reproducible.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "engine/games/connect4.h"

namespace ms::games {

inline constexpr int kWinScore = 10000;

// The Pons score (+-p, 0) of a solved score on the scale above.
inline int solver_score(int score) {
    return score > kWinScore ? score - kWinScore : score < -kWinScore ? score + kWinScore : 0;
}

enum class TieBreak : uint8_t { kCentre, kRandom };

struct SearchOptions {
    int depth = 0;  // plies searched before the heuristic; <= 0: no limit, a full solve
    TieBreak tie_break = TieBreak::kCentre;
    uint64_t seed = 0;  // kRandom's draws
};

struct SearchResult {
    int move = -1;            // the column (0-based) to play
    int score = 0;            // the position's score (the scale above)
    uint64_t best_moves = 0;  // bit c: column c scores `score`
    uint64_t nodes = 0;       // positions searched
};

class AlphaBeta {
  public:
    // A transposition table of 2^table_log2 entries (16 bytes each), allocated once.
    explicit AlphaBeta(int table_log2 = 20);

    // The best move of `state`, a game that is not over (MS_CHECK).
    SearchResult search(const Connect4& state, const SearchOptions& options);

  private:
    struct Entry {
        uint64_t key = 0;
        int16_t value = 0;
        uint8_t bound = 0;  // Bound
        uint32_t generation = 0;
    };
    static_assert(sizeof(Entry) == 16);
    enum Bound : uint8_t { kExact, kLower, kUpper };

    // The board the derived masks below are of; set by prepare() when a search's board differs.
    struct Geometry {
        int rows = 0, cols = 0, cells = 0;
        uint64_t bottom = 0, board = 0;
        std::array<uint64_t, Connect4::kMaxCols> column{};  // each column's cells
        std::array<int, Connect4::kMaxCols> order{};        // the columns, centre first
        std::vector<uint64_t> lines;                        // every line of four cells
    };

    void prepare(int rows, int cols);
    uint64_t winning_cells(uint64_t stones, uint64_t mask) const;
    uint64_t non_losing_moves(uint64_t current, uint64_t mask) const;
    int heuristic(uint64_t current, uint64_t mask) const;
    int negamax(uint64_t current, uint64_t mask, int moves, int alpha, int beta, int depth);

    std::vector<Entry> table_;
    uint64_t index_shift_;
    uint32_t generation_ = 0;
    Geometry geo_;
    uint64_t nodes_ = 0;
};

}  // namespace ms::games
