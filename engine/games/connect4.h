// connect4.h: Connect Four on two 64-bit bitboards, on boards of 4..8 rows and 4..9 columns (the curriculum's 4x5,
// 5x6, then the standard 6x7), the layout of Pascal Pons' solver.
//
// Layout: column c, row r (row 0 at the bottom) is bit c * (rows + 1) + r. Each column holds rows + 1 bits, the
// top one a sentinel that never holds a stone, so a board needs (rows + 1) * cols <= 64. The sentinel is what makes
// the line tests plain shifts: a run of bits that crosses from one column into the next passes through a sentinel
// (vertical runs, shift 1) or lands on one (the diagonals, shifts rows and rows + 2; horizontal runs, shift
// rows + 1, never leave their row), so no run of four set bits is anything but a line of four on the board.
//
// State: `current_` the stones of the side to move, `mask_` all stones. Playing a move hands the turn over by
// current_ ^= mask_ (now the other side's stones) and adds the stone to mask_ alone (mask_ + the column's bottom
// bit carries into the column's lowest empty cell). key() = current_ + mask_ is exact: a column with h stones, of
// which the side to move's are P (< 2^h), adds P + 2^h - 1 to it, a value in [2^h - 1, 2^(h+1) - 2]. These ranges
// do not overlap for different h and stay below 2^(rows+1), inside the column's bits, so h and P can be read back.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "engine/games/game.h"

namespace ms::games {

class Connect4 {
  public:
    static constexpr int kMinRows = 4, kMaxRows = 8, kMinCols = 4, kMaxCols = 9;

    // Throws UserError unless rows x cols is a board Connect4 can be played on (the ranges above, and the
    // bitboard's bits).
    static void check_size(int rows, int cols);
    // The empty board (check_size first).
    static Connect4 empty(int rows, int cols);
    // The position after `moves`, one digit per move, the 1-based column ("4453": columns 4, 4, 5, 3; the notation
    // of Pons' solver test sets). Throws UserError for a character that is no column of the board, a move into a
    // full column, or a move after the game has ended.
    static Connect4 from_moves(int rows, int cols, std::string_view moves);
    // The position whose bitboards are `current` (the side to move's stones) and `all` (every stone), as
    // current_stones() and all_stones() give them: the way back in for a file that stored them. The move count
    // follows from the stones. Throws UserError for what a file can hold wrongly: a board size check_size refuses,
    // a stone outside the board (a sentinel bit, a column past the last), a stone above an empty cell, a side-to-move
    // stone that is not in `all`, stone counts that do not fit the side to move (it has placed moves / 2 stones), or
    // four in a line for the side to move (the game would have ended before the other side's last move).
    static Connect4 from_bitboards(int rows, int cols, uint64_t current, uint64_t all);

    // The bit of column `col`, row `row` (0 at the bottom): the layout above, in one place.
    static constexpr int bit_index(int rows, int col, int row) { return col * (rows + 1) + row; }
    // The bottom cell of every column (the carry that plays a move), and every cell of the board.
    static uint64_t bottom_mask(int rows, int cols);
    static uint64_t board_mask(int rows, int cols) { return bottom_mask(rows, cols) * ((uint64_t{1} << rows) - 1); }
    // Whether `stones` (of one side, on a board of `rows` rows) hold four in a line in any direction.
    static constexpr bool has_four(uint64_t stones, int rows) {
        for (const int shift : {1, rows, rows + 1, rows + 2}) {  // vertical, diagonal \, horizontal, diagonal /
            const uint64_t pairs = stones & (stones >> shift);
            if (pairs & (pairs >> (2 * shift))) return true;
        }
        return false;
    }

    // The empty cells of `board` (board_mask) where one more stone of `stones` completes four, in any direction, on a
    // board of `rows` rows whose stones are `all` (Pons' bitboard shifts): a side's threats.
    static uint64_t winning_cells(uint64_t stones, uint64_t all, int rows, uint64_t board);

    // cell_flags()'s bits.
    static constexpr int8_t kFlagPlayable = 1;      // empty, and a stone dropped in its column lands there
    static constexpr int8_t kFlagToMoveWins = 2;    // a stone of the side to move there completes four
    static constexpr int8_t kFlagOpponentWins = 4;  // a stone of the opponent there completes four

    Connect4() = default;  // the empty 6 x 7 board

    int rows() const { return rows_; }
    int cols() const { return cols_; }
    int num_actions() const { return cols_; }
    int move_count() const { return moves_; }
    // 0: the side that moved first (X in to_string) is to move; 1: the other (O).
    int side_to_move() const { return moves_ & 1; }

    // Bit c set: column c (0-based) is not full. Not 0 only because the game may be over: see outcome().
    uint64_t legal_moves() const;
    bool is_legal(int col) const { return col >= 0 && col < cols_ && !(mask_ & top_cell(col)); }
    // The side to move drops a stone in column `col`; MS_CHECK that the column is legal and the game not over (a
    // search's bug, not a user's: from_moves is the checked way in).
    void play(int col);

    bool last_mover_won() const { return has_four(mask_ ^ current_, rows_); }
    bool is_full() const { return moves_ == rows_ * cols_; }
    Outcome outcome() const;
    bool is_terminal() const { return outcome() != Outcome::kOngoing; }

    // rows * cols cell codes (game.h), row-major, the top row first.
    void cells(std::span<int8_t> out) const;
    // rows * cols sets of the kFlag bits above, in cells()' order: the network's threat features.
    void cell_flags(std::span<int8_t> out) const;
    // The cell (row-major index, top row first, as cells()) a stone dropped in column `col` lands on: the policy
    // head's cell for the action. A full column (illegal) gives its top cell.
    int action_cell(int col) const;
    uint64_t key() const { return current_ + mask_; }
    // The board reflected left to right (column c becomes cols - 1 - c): the game's one symmetry, for augmenting
    // training positions (the policy reflects the same way).
    Connect4 mirrored() const;
    // One line per row, top row first, 'X' for the side that moved first, 'O' for the other, '.' empty.
    std::string to_string() const;

    // The bitboards, for a search that works on them directly (engine/games/alpha_beta.h).
    uint64_t current_stones() const { return current_; }
    uint64_t all_stones() const { return mask_; }

    friend bool operator==(const Connect4&, const Connect4&) = default;

  private:
    uint64_t top_cell(int col) const { return uint64_t{1} << bit_index(rows_, col, rows_ - 1); }

    uint64_t current_ = 0;  // the side to move's stones
    uint64_t mask_ = 0;     // all stones
    uint8_t rows_ = 6;
    uint8_t cols_ = 7;
    uint8_t moves_ = 0;  // stones on the board
};

static_assert(Game<Connect4>);
static_assert(sizeof(Connect4) <= 24);

}  // namespace ms::games
