// connect4.cpp: the Connect4 state (connect4.h): size checks, the move parser, moves, outcome, and its views.
#include "engine/games/connect4.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <string>

#include "engine/core/check.h"

namespace ms::games {

void Connect4::check_size(int rows, int cols) {
    std::string problem;
    if (rows < kMinRows || rows > kMaxRows) {
        problem = fmt::format("rows must be {}..{}", kMinRows, kMaxRows);
    } else if (cols < kMinCols || cols > kMaxCols) {
        problem = fmt::format("columns must be {}..{}", kMinCols, kMaxCols);
    } else if ((rows + 1) * cols > 64) {
        problem = fmt::format(
            "(rows + 1) * columns = {} is over the 64 bits of the bitboard, which holds rows + 1 "
            "bits per column",
            (rows + 1) * cols);
    } else {
        return;
    }
    throw UserError(
        fmt::format("game error: connect4 cannot be played on a board of {} rows x {} columns: {}; the "
                    "largest boards are 8 x 7, 7 x 8 and 6 x 9, the standard one 6 x 7",
                    rows, cols, problem));
}

uint64_t Connect4::bottom_mask(int rows, int cols) {
    uint64_t bottom = 0;
    for (int c = 0; c < cols; ++c) bottom |= uint64_t{1} << bit_index(rows, c, 0);
    return bottom;
}

Connect4 Connect4::empty(int rows, int cols) {
    check_size(rows, cols);
    Connect4 state;
    state.rows_ = static_cast<uint8_t>(rows);
    state.cols_ = static_cast<uint8_t>(cols);
    return state;
}

Connect4 Connect4::from_moves(int rows, int cols, std::string_view moves) {
    Connect4 state = empty(rows, cols);
    for (size_t i = 0; i < moves.size(); ++i) {
        const char ch = moves[i];
        const int col = ch - '1';
        const auto refuse = [&](const std::string& why) {
            throw UserError(fmt::format("game error: connect4 moves '{}': move {} ('{}') {}", moves, i + 1, ch, why));
        };
        if (col < 0 || col >= cols) refuse(fmt::format("is not a column of the {}-column board (1..{})", cols, cols));
        if (state.last_mover_won()) {
            refuse(fmt::format("comes after the game ended: {} completed four at move {}",
                               state.side_to_move() == 0 ? 'O' : 'X', i));
        }
        if (!state.is_legal(col)) refuse(fmt::format("is into column {}, which is full", col + 1));
        state.play(col);
    }
    return state;
}

Connect4 Connect4::from_bitboards(int rows, int cols, uint64_t current, uint64_t all) {
    Connect4 state = empty(rows, cols);
    const auto refuse = [&](const std::string& why) {
        throw UserError(fmt::format(
            "game error: connect4 bitboards (current {:#x}, all {:#x}) on a {} x {} board are no position: {}", current,
            all, rows, cols, why));
    };
    const uint64_t outside = all & ~board_mask(rows, cols);
    if (outside) {
        const int bit = std::countr_zero(outside);
        refuse(fmt::format("bit {} holds a stone but is {} (a column holds rows + 1 = {} bits, the top one empty)", bit,
                           bit >= (rows + 1) * cols ? "past the last column" : "a column's empty top bit", rows + 1));
    }
    // A column whose stones fill its cells from the bottom up gains exactly its next empty cell when its bottom bit
    // is added (the carry stops at the first empty cell); a gap under a stone leaves that stone in the sum.
    const uint64_t floating = (all + bottom_mask(rows, cols)) & all;
    if (floating) {
        const int bit = std::countr_zero(floating);
        refuse(
            fmt::format("the stone in column {}, row {} (from 1, the bottom row 1) is above an empty cell, but "
                        "stones stack from the bottom",
                        bit / (rows + 1) + 1, bit % (rows + 1) + 1));
    }
    if (current & ~all) refuse("the side to move has stones where `all` has none (current must be a subset of all)");
    const int moves = std::popcount(all), mine = std::popcount(current);
    if (mine != moves / 2) {  // the side that moved first has placed one stone more after an odd number of moves
        refuse(fmt::format("the side to move has {} of the {} stones, where it must have {} (half, rounded down)", mine,
                           moves, moves / 2));
    }
    if (has_four(current, rows)) refuse("the side to move has four in a line, so the game ended before the last move");
    state.current_ = current;
    state.mask_ = all;
    state.moves_ = static_cast<uint8_t>(moves);
    return state;
}

uint64_t Connect4::legal_moves() const {
    uint64_t legal = 0;
    for (int c = 0; c < cols_; ++c) {
        if (!(mask_ & top_cell(c))) legal |= uint64_t{1} << c;
    }
    return legal;
}

void Connect4::play(int col) {
    MS_CHECK(is_legal(col), "connect4: move into column {} (0-based) of a {}-column board, which is not legal:\n{}",
             col, cols_, to_string());
    MS_CHECK(!last_mover_won(), "connect4: move after the game ended:\n{}", to_string());
    current_ ^= mask_;
    mask_ |= mask_ + (uint64_t{1} << bit_index(rows_, col, 0));
    ++moves_;
}

Outcome Connect4::outcome() const {
    if (last_mover_won()) return Outcome::kLoss;
    return is_full() ? Outcome::kDraw : Outcome::kOngoing;
}

void Connect4::cells(std::span<int8_t> out) const {
    MS_CHECK(out.size() == static_cast<size_t>(rows_) * cols_, "connect4: cells() needs {} x {} = {} codes, got {}",
             rows_, cols_, rows_ * cols_, out.size());
    for (int r = 0; r < rows_; ++r) {
        for (int c = 0; c < cols_; ++c) {
            const uint64_t cell = uint64_t{1} << bit_index(rows_, c, rows_ - 1 - r);
            out[static_cast<size_t>(r) * cols_ + c] = !(mask_ & cell)     ? kCellEmpty
                                                      : (current_ & cell) ? kCellToMove
                                                                          : kCellOpponent;
        }
    }
}

uint64_t Connect4::winning_cells(uint64_t stones, uint64_t all, int rows, uint64_t board) {
    uint64_t cells = (stones << 1) & (stones << 2) & (stones << 3);  // vertical: only the three below
    const int height = rows + 1;
    for (const int shift : {height, height - 1, height + 1}) {
        uint64_t pair = (stones << shift) & (stones << 2 * shift);
        cells |= pair & (stones << 3 * shift);
        cells |= pair & (stones >> shift);
        pair = (stones >> shift) & (stones >> 2 * shift);
        cells |= pair & (stones << shift);
        cells |= pair & (stones >> 3 * shift);
    }
    return cells & (board ^ all);
}

void Connect4::cell_flags(std::span<int8_t> out) const {
    MS_CHECK(out.size() == static_cast<size_t>(rows_) * cols_,
             "connect4: cell_flags() needs {} x {} = {} flags, got {}", rows_, cols_, rows_ * cols_, out.size());
    const uint64_t board = board_mask(rows_, cols_);
    const uint64_t playable = (mask_ + bottom_mask(rows_, cols_)) & board;
    const uint64_t to_move = winning_cells(current_, mask_, rows_, board);
    const uint64_t opponent = winning_cells(current_ ^ mask_, mask_, rows_, board);
    for (int r = 0; r < rows_; ++r) {
        for (int c = 0; c < cols_; ++c) {
            const uint64_t cell = uint64_t{1} << bit_index(rows_, c, rows_ - 1 - r);
            out[static_cast<size_t>(r) * cols_ + c] =
                static_cast<int8_t>((playable & cell ? kFlagPlayable : 0) | (to_move & cell ? kFlagToMoveWins : 0) |
                                    (opponent & cell ? kFlagOpponentWins : 0));
        }
    }
}

int Connect4::action_cell(int col) const {
    MS_CHECK(col >= 0 && col < cols_, "connect4: action_cell of column {} on a {}-column board", col, cols_);
    const uint64_t column = (mask_ >> bit_index(rows_, col, 0)) & ((uint64_t{1} << rows_) - 1);
    const int height = std::min(std::popcount(column), rows_ - 1);  // the landing row, from the bottom
    return (rows_ - 1 - height) * cols_ + col;
}

Connect4 Connect4::mirrored() const {
    Connect4 out = *this;
    out.current_ = out.mask_ = 0;
    const int height = rows_ + 1;
    const uint64_t column = (uint64_t{1} << height) - 1;
    for (int c = 0; c < cols_; ++c) {
        const int from = bit_index(rows_, c, 0), to = bit_index(rows_, cols_ - 1 - c, 0);
        out.current_ |= ((current_ >> from) & column) << to;
        out.mask_ |= ((mask_ >> from) & column) << to;
    }
    return out;
}

std::string Connect4::to_string() const {
    const uint64_t first = side_to_move() == 0 ? current_ : current_ ^ mask_;  // the stones of the side that began
    std::string out;
    out.reserve(static_cast<size_t>(rows_) * (cols_ + 1));
    for (int r = rows_ - 1; r >= 0; --r) {
        for (int c = 0; c < cols_; ++c) {
            const uint64_t cell = uint64_t{1} << bit_index(rows_, c, r);
            out += !(mask_ & cell) ? '.' : (first & cell) ? 'X' : 'O';
        }
        out += '\n';
    }
    return out;
}

}  // namespace ms::games
