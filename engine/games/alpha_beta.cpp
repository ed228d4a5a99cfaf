// alpha_beta.cpp: the Connect Four alpha-beta search (alpha_beta.h).
//
// negamax() searches a position that is not over and whose side to move cannot win at once (the parent made sure:
// it plays only non-losing moves, and the root takes an immediate win itself). It is fail-hard within [alpha, beta]
// after two clamps Pons' solver uses: the side to move cannot score above a win with its next-but-one stone, nor
// below a loss to the opponent's next-but-one stone, since neither side wins on its next move.
#include "engine/games/alpha_beta.h"

#include <algorithm>
#include <bit>
#include <cstdlib>

#include "engine/core/check.h"

namespace ms::games {

namespace {

constexpr int kInfinity = 1 << 20;
// More plies than any board has cells: a search that never reaches a depth limit.
constexpr int kNoDepthLimit = 1 << 10;
// A line holding n stones of one side and none of the other is worth kLineWeight[n] to that side.
constexpr int kLineWeight[4] = {0, 1, 4, 16};

// A Pons score (+-p, 0) on the search's scale (alpha_beta.h).
int to_score(int p) { return p > 0 ? kWinScore + p : p < 0 ? p - kWinScore : 0; }

}  // namespace

AlphaBeta::AlphaBeta(int table_log2) {
    MS_CHECK(table_log2 >= 1 && table_log2 <= 30, "alpha-beta table of 2^{} entries: 2^1..2^30", table_log2);
    table_.resize(size_t{1} << table_log2);
    index_shift_ = 64 - table_log2;
}

void AlphaBeta::prepare(int rows, int cols) {
    if (geo_.rows == rows && geo_.cols == cols) return;
    geo_ = Geometry{};
    geo_.rows = rows;
    geo_.cols = cols;
    geo_.cells = rows * cols;
    geo_.bottom = Connect4::bottom_mask(rows, cols);
    geo_.board = Connect4::board_mask(rows, cols);
    for (int c = 0; c < cols; ++c) {
        geo_.column[c] = ((uint64_t{1} << rows) - 1) << Connect4::bit_index(rows, c, 0);
        geo_.order[c] = c;
    }
    std::stable_sort(geo_.order.begin(), geo_.order.begin() + cols,
                     [cols](int a, int b) { return std::abs(2 * a - (cols - 1)) < std::abs(2 * b - (cols - 1)); });
    constexpr int kDirections[4][2] = {{1, 0}, {0, 1}, {1, 1}, {1, -1}};  // (column, row) steps
    for (int c = 0; c < cols; ++c) {
        for (int r = 0; r < rows; ++r) {
            for (const auto& d : kDirections) {
                const int end_c = c + 3 * d[0], end_r = r + 3 * d[1];
                if (end_c >= cols || end_r < 0 || end_r >= rows) continue;
                uint64_t line = 0;
                for (int i = 0; i < 4; ++i)
                    line |= uint64_t{1} << Connect4::bit_index(rows, c + i * d[0], r + i * d[1]);
                geo_.lines.push_back(line);
            }
        }
    }
}

// The empty cells (playable now or not) that would complete four for `stones`: three of them around the cell in
// one of the 4 directions, in each of the 4 ways a line of four can hold it.
uint64_t AlphaBeta::winning_cells(uint64_t stones, uint64_t mask) const {
    return Connect4::winning_cells(stones, mask, geo_.rows, geo_.board);
}

// The playable cells that do not let the opponent win on its next move: the one cell blocking its only immediate
// threat if it has one (none if it has two), and never the cell below one of its winning cells.
uint64_t AlphaBeta::non_losing_moves(uint64_t current, uint64_t mask) const {
    uint64_t possible = (mask + geo_.bottom) & geo_.board;
    const uint64_t threats = winning_cells(current ^ mask, mask);
    const uint64_t forced = possible & threats;
    if (forced) {
        if (forced & (forced - 1)) return 0;
        possible = forced;
    }
    return possible & ~(threats >> 1);
}

int AlphaBeta::heuristic(uint64_t current, uint64_t mask) const {
    const uint64_t opponent = current ^ mask;
    int score = 0;
    for (const uint64_t line : geo_.lines) {
        const int mine = std::popcount(line & current), theirs = std::popcount(line & opponent);
        if (theirs == 0) score += kLineWeight[std::min(mine, 3)];
        if (mine == 0) score -= kLineWeight[std::min(theirs, 3)];
    }
    return std::clamp(score, 1 - kWinScore, kWinScore - 1);
}

int AlphaBeta::negamax(uint64_t current, uint64_t mask, int moves, int alpha, int beta, int depth) {
    ++nodes_;
    const uint64_t next = non_losing_moves(current, mask);
    if (next == 0) return to_score(-(geo_.cells - moves) / 2);  // the opponent wins with its next stone
    if (moves >= geo_.cells - 2) return 0;  // our stone and the opponent's last one: neither can complete four
    const int lowest = to_score(-(geo_.cells - 2 - moves) / 2);
    if (alpha < lowest) {
        alpha = lowest;
        if (alpha >= beta) return alpha;
    }
    const int highest = to_score((geo_.cells - 1 - moves) / 2);
    if (beta > highest) {
        beta = highest;
        if (alpha >= beta) return beta;
    }
    if (depth <= 0) return std::clamp(heuristic(current, mask), alpha, beta);

    const uint64_t key = current + mask;
    const size_t slot = (key * 0x9E3779B97F4A7C15ull) >> index_shift_;
    if (const Entry& e = table_[slot]; e.generation == generation_ && e.key == key) {
        if (e.bound == kExact) return e.value;
        if (e.bound == kLower) alpha = std::max<int>(alpha, e.value);
        if (e.bound == kUpper) beta = std::min<int>(beta, e.value);
        if (alpha >= beta) return alpha;
    }

    // Moves that leave the most winning cells first (threats win games), then the centre first.
    std::array<int, Connect4::kMaxCols> cols{};
    std::array<int, Connect4::kMaxCols> threats{};
    int count = 0;
    for (int i = 0; i < geo_.cols; ++i) {
        const int c = geo_.order[i];
        const uint64_t move = next & geo_.column[c];
        if (!move) continue;
        const int t = std::popcount(winning_cells(current | move, mask | move));
        int at = count++;
        for (; at > 0 && threats[at - 1] < t; --at) {
            cols[at] = cols[at - 1];
            threats[at] = threats[at - 1];
        }
        cols[at] = c;
        threats[at] = t;
    }

    const int alpha_start = alpha;
    for (int i = 0; i < count; ++i) {
        const uint64_t move = next & geo_.column[cols[i]];
        const int score = -negamax(current ^ mask, mask | move, moves + 1, -beta, -alpha, depth - 1);
        if (score >= beta) {
            table_[slot] = Entry{key, static_cast<int16_t>(score), kLower, generation_};
            return score;
        }
        alpha = std::max(alpha, score);
    }
    table_[slot] = Entry{key, static_cast<int16_t>(alpha), alpha > alpha_start ? kExact : kUpper, generation_};
    return alpha;
}

SearchResult AlphaBeta::search(const Connect4& state, const SearchOptions& options) {
    MS_CHECK(!state.is_terminal(), "alpha-beta search of a finished game:\n{}", state.to_string());
    prepare(state.rows(), state.cols());
    if (++generation_ == 0) {  // wrapped: entries of generation 1 could be 2^32 searches old
        std::fill(table_.begin(), table_.end(), Entry{});
        generation_ = 1;
    }
    nodes_ = 1;
    const int depth = options.depth <= 0 ? kNoDepthLimit : options.depth;
    const uint64_t current = state.current_stones(), mask = state.all_stones();
    const int moves = state.move_count();

    SearchResult result;
    const uint64_t wins = winning_cells(current, mask) & (mask + geo_.bottom) & geo_.board;
    const uint64_t next = non_losing_moves(current, mask);
    if (wins) {
        result.score = to_score((geo_.cells + 1 - moves) / 2);
        for (int c = 0; c < geo_.cols; ++c) {
            if (wins & geo_.column[c]) result.best_moves |= uint64_t{1} << c;
        }
    } else if (next == 0) {  // every move loses to the opponent's next stone
        result.score = to_score(-(geo_.cells - moves) / 2);
        result.best_moves = state.legal_moves();
    } else {
        // Each move searched with a window just below the best score so far: a move that scores as much gets its
        // exact score, one that scores less fails low.
        result.score = -kInfinity;
        for (int i = 0; i < geo_.cols; ++i) {
            const int c = geo_.order[i];
            const uint64_t move = next & geo_.column[c];
            if (!move) continue;
            const int score = -negamax(current ^ mask, mask | move, moves + 1, -kInfinity, 1 - result.score, depth - 1);
            if (score > result.score) {
                result.score = score;
                result.best_moves = 0;
            }
            if (score == result.score) result.best_moves |= uint64_t{1} << c;
        }
    }
    if (options.tie_break == TieBreak::kRandom) {
        result.move = random_set_bit(result.best_moves, options.seed, state.key(), kDrawTieBreak);
    } else {
        for (int i = 0; i < geo_.cols && result.move < 0; ++i) {
            if (result.best_moves & (uint64_t{1} << geo_.order[i])) result.move = geo_.order[i];
        }
    }
    result.nodes = nodes_;
    return result;
}

}  // namespace ms::games
