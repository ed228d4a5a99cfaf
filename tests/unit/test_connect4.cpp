// test_connect4.cpp: engine/games -- Connect Four's rules on the bitboard (lines in every direction, on several
// board sizes, at the edges, and none across the bitboard's column boundary), draws, illegal moves, the move parser
// and its refusals, the network's cell codes, the position key, and the alpha-beta search: immediate wins and
// blocks, full solves checked against a plain minimax written here on a 2-D array, determinism, tie-breaks, and
// games against the random player.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/core/check.h"
#include "engine/games/alpha_beta.h"
#include "engine/games/connect4.h"
#include "engine/games/game.h"

namespace {

using ms::games::AlphaBeta;
using ms::games::Connect4;
using ms::games::kWinScore;
using ms::games::Outcome;
using ms::games::SearchOptions;
using ms::games::SearchResult;
using ms::games::TieBreak;

// Every board the bitboard holds.
std::vector<std::array<int, 2>> all_sizes() {
    std::vector<std::array<int, 2>> sizes;
    for (int rows = Connect4::kMinRows; rows <= Connect4::kMaxRows; ++rows) {
        for (int cols = Connect4::kMinCols; cols <= Connect4::kMaxCols; ++cols) {
            if ((rows + 1) * cols <= 64) sizes.push_back({rows, cols});
        }
    }
    return sizes;
}

// The UserError text of f(), or "" when it does not throw one.
template <typename F>
std::string user_error(F f) {
    try {
        f();
    } catch (const ms::UserError& e) {
        EXPECT_EQ(e.exit_code(), ms::kExitConfigError);
        return e.what();
    }
    return "";
}

// The line `moves` ends with is four (and the position before its last move was not over).
void expect_win(int rows, int cols, const std::string& moves, const std::string& board) {
    SCOPED_TRACE(moves);
    const Connect4 before = Connect4::from_moves(rows, cols, moves.substr(0, moves.size() - 1));
    EXPECT_EQ(before.outcome(), Outcome::kOngoing);
    const Connect4 after = Connect4::from_moves(rows, cols, moves);
    EXPECT_EQ(after.to_string(), board);
    EXPECT_TRUE(after.last_mover_won());
    EXPECT_EQ(after.outcome(), Outcome::kLoss);
    EXPECT_TRUE(after.is_terminal());
    EXPECT_EQ(ms::games::outcome_value(after.outcome()), -1.0f);
}

TEST(Connect4, FourSetBitsAreALineExactlyWhenTheyAreOneOnTheBoard) {
    // has_four() of any 4 cells spaced evenly in bit index (the only sets its shifts can see) against the geometry:
    // true exactly for the board's lines, so none of the runs that cross a column boundary counts.
    for (const auto [rows, cols] : all_sizes()) {
        SCOPED_TRACE(testing::Message() << rows << " x " << cols);
        const int height = rows + 1;
        int found = 0;
        for (int start = 0; start < 64; ++start) {
            for (const int step : {1, rows, rows + 1, rows + 2}) {
                uint64_t stones = 0;
                bool on_board = true;
                int col[4], row[4];
                for (int i = 0; i < 4; ++i) {
                    const int bit = start + i * step;
                    col[i] = bit / height;
                    row[i] = bit % height;
                    on_board = on_board && col[i] < cols && row[i] < rows;
                    if (on_board) stones |= uint64_t{1} << bit;
                }
                if (!on_board) continue;
                const int dc = col[1] - col[0], dr = row[1] - row[0];
                bool line = (dc == 0 && dr == 1) || (dc == 1 && (dr == 0 || dr == 1 || dr == -1));
                for (int i = 2; i < 4; ++i) line = line && col[i] - col[i - 1] == dc && row[i] - row[i - 1] == dr;
                EXPECT_EQ(Connect4::has_four(stones, rows), line)
                    << "cells from column " << col[0] << " row " << row[0] << ", bit step " << step;
                EXPECT_FALSE(Connect4::has_four(stones & (stones - 1), rows));  // three of them
                found += line;
            }
        }
        // Every line of the board is one of those sets, once.
        EXPECT_EQ(found, rows * (cols - 3) + cols * (rows - 3) + 2 * (rows - 3) * (cols - 3));
    }
}

TEST(Connect4, WinsInEveryDirectionAtTheEdges) {
    expect_win(6, 7, "1122334",  // horizontal, bottom row, left edge
               ".......\n"
               ".......\n"
               ".......\n"
               ".......\n"
               "OOO....\n"
               "XXXX...\n");
    expect_win(6, 7, "4455667",  // horizontal, bottom row, right edge
               ".......\n"
               ".......\n"
               ".......\n"
               ".......\n"
               "...OOO.\n"
               "...XXXX\n");
    expect_win(6, 7, "17277172717",  // vertical, right edge, up to the top row
               "......X\n"
               "......X\n"
               "......X\n"
               "O.....X\n"
               "OO....O\n"
               "XX....O\n");
    expect_win(6, 7, "12234334474",  // diagonal /, from the left edge
               ".......\n"
               ".......\n"
               "...X...\n"
               "..XX...\n"
               ".XOO...\n"
               "XOOX..O\n");
    expect_win(6, 7, "76654554414",  // diagonal \, down to the right edge
               ".......\n"
               ".......\n"
               "...X...\n"
               "...XX..\n"
               "...OOX.\n"
               "O..XOOX\n");
    expect_win(4, 4, "12234334414",  // diagonal /, corner to corner of the smallest board
               "...X\n"
               "..XX\n"
               "OXOO\n"
               "XOOX\n");
    expect_win(5, 4, "144141424",  // vertical, last column, up to the top row
               "...X\n"
               "...X\n"
               "O..X\n"
               "O..X\n"
               "XO.O\n");
    expect_win(7, 8, "5566778",  // horizontal in the last column, whose sentinel is bit 63
               "........\n"
               "........\n"
               "........\n"
               "........\n"
               "........\n"
               "....OOO.\n"
               "....XXXX\n");
    expect_win(4, 5, "12324212",  // the second player's line: vertical, up to the top row
               ".O...\n"
               ".O...\n"
               "XO...\n"
               "XOXX.\n");
}

TEST(Connect4, NoLineAcrossTheColumnBoundary) {
    // X holds the top three cells of column 1 and the bottom cell of column 2: four consecutive bits on a bitboard
    // without the sentinel row, but no line.
    const Connect4 state = Connect4::from_moves(6, 7, "211113131");
    EXPECT_EQ(state.to_string(),
              "X......\n"
              "X......\n"
              "X......\n"
              "O......\n"
              "X.O....\n"
              "OXO....\n");
    EXPECT_FALSE(state.last_mover_won());
    EXPECT_EQ(state.outcome(), Outcome::kOngoing);
}

TEST(Connect4, FullBoardWithoutALineIsADraw) {
    const std::array<std::array<int, 2>, 3> sizes = {{{6, 7}, {4, 5}, {5, 4}}};
    const std::array<const char*, 3> games = {"112111142522324243436334366777757554565667", "21111322425334345545",
                                              "21212112124343433434"};
    for (size_t i = 0; i < games.size(); ++i) {
        SCOPED_TRACE(games[i]);
        const auto [rows, cols] = sizes[i];
        const std::string moves = games[i];
        const Connect4 before = Connect4::from_moves(rows, cols, moves.substr(0, moves.size() - 1));
        EXPECT_EQ(before.outcome(), Outcome::kOngoing);
        EXPECT_EQ(std::popcount(before.legal_moves()), 1);
        const Connect4 full = Connect4::from_moves(rows, cols, moves);
        EXPECT_EQ(full.move_count(), rows * cols);
        EXPECT_TRUE(full.is_full());
        EXPECT_FALSE(full.last_mover_won());
        EXPECT_EQ(full.outcome(), Outcome::kDraw);
        EXPECT_EQ(ms::games::outcome_value(full.outcome()), 0.0f);
        EXPECT_EQ(full.legal_moves(), 0u);
    }
}

TEST(Connect4, FullColumnIsNotLegal) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    Connect4 state = Connect4::from_moves(6, 7, "111111");
    EXPECT_EQ(state.legal_moves(), 0b1111110u);
    EXPECT_FALSE(state.is_legal(0));
    EXPECT_FALSE(state.is_legal(7));
    EXPECT_FALSE(state.is_legal(-1));
    EXPECT_DEATH(state.play(0), "move into column 0 \\(0-based\\) of a 7-column board, which is not legal");
    EXPECT_DEATH(state.play(7), "which is not legal");
    Connect4 won = Connect4::from_moves(6, 7, "1122334");
    EXPECT_DEATH(won.play(6), "move after the game ended");
    EXPECT_EQ(Connect4::from_moves(4, 4, "1111").legal_moves(), 0b1110u);
}

TEST(Connect4, FromMovesRefusesWithASentence) {
    EXPECT_EQ(user_error([] { Connect4::from_moves(6, 7, "1111111"); }),
              "game error: connect4 moves '1111111': move 7 ('1') is into column 1, which is full");
    EXPECT_EQ(user_error([] { Connect4::from_moves(6, 7, "11223344"); }),
              "game error: connect4 moves '11223344': move 8 ('4') comes after the game ended: X completed four at "
              "move 7");
    EXPECT_EQ(user_error([] { Connect4::from_moves(4, 5, "12324212"); }), "");
    EXPECT_EQ(user_error([] { Connect4::from_moves(4, 5, "123242121"); }),
              "game error: connect4 moves '123242121': move 9 ('1') comes after the game ended: O completed four at "
              "move 8");
    EXPECT_EQ(user_error([] { Connect4::from_moves(6, 7, "12a"); }),
              "game error: connect4 moves '12a': move 3 ('a') is not a column of the 7-column board (1..7)");
    EXPECT_EQ(user_error([] { Connect4::from_moves(6, 7, "8"); }),
              "game error: connect4 moves '8': move 1 ('8') is not a column of the 7-column board (1..7)");
    EXPECT_EQ(user_error([] { Connect4::from_moves(4, 5, "0"); }),
              "game error: connect4 moves '0': move 1 ('0') is not a column of the 5-column board (1..5)");
    EXPECT_EQ(Connect4::from_moves(6, 9, "9").legal_moves(), 0b111111111u);
}

TEST(Connect4, FromMovesIsPlayMoveByMove) {
    const std::string moves = "4453276";
    Connect4 state = Connect4::empty(6, 7);
    EXPECT_EQ(state, Connect4());
    for (const char ch : moves) state.play(ch - '1');
    EXPECT_EQ(state, Connect4::from_moves(6, 7, moves));
    EXPECT_EQ(state.move_count(), 7);
    EXPECT_EQ(state.side_to_move(), 1);
    EXPECT_EQ(state.to_string(),
              ".......\n"
              ".......\n"
              ".......\n"
              ".......\n"
              "...O...\n"
              ".XOXXXO\n");
    // The reflection: the moves mirrored, and twice the identity.
    EXPECT_EQ(state.mirrored(), Connect4::from_moves(6, 7, "4435612"));
    EXPECT_EQ(state.mirrored().mirrored(), state);
    EXPECT_EQ(Connect4::from_moves(5, 4, "1124").mirrored(), Connect4::from_moves(5, 4, "4431"));
}

TEST(Connect4, CellsAreFromTheSideToMovesView) {
    using ms::games::kCellEmpty, ms::games::kCellOpponent, ms::games::kCellToMove;
    constexpr int8_t e = kCellEmpty, m = kCellToMove, o = kCellOpponent;
    std::vector<int8_t> cells(20, -1);
    Connect4::from_moves(4, 5, "3312").cells(cells);      // X to move
    EXPECT_EQ(cells, (std::vector<int8_t>{e, e, e, e, e,  //
                                          e, e, e, e, e,  //
                                          e, e, o, e, e,  //
                                          m, o, m, e, e}));
    Connect4::from_moves(4, 5, "33121").cells(cells);     // O to move: the same stones change codes
    EXPECT_EQ(cells, (std::vector<int8_t>{e, e, e, e, e,  //
                                          e, e, e, e, e,  //
                                          o, e, m, e, e,  //
                                          o, m, o, e, e}));
    std::vector<int8_t> standard(42, -1);
    Connect4().cells(standard);
    EXPECT_EQ(standard, std::vector<int8_t>(42, e));
}

TEST(Connect4, ActionCellIsWhereTheStoneLands) {
    // 4 x 5 after "3312": column 3 (0-based 2) holds two stones, columns 1 and 2 one each, the others none
    const Connect4 state = Connect4::from_moves(4, 5, "3312");
    EXPECT_EQ(state.action_cell(0), 2 * 5 + 0);  // on the stone in the bottom row
    EXPECT_EQ(state.action_cell(2), 1 * 5 + 2);  // on the two stones
    EXPECT_EQ(state.action_cell(4), 3 * 5 + 4);  // the bottom row
    // each cell a move lands on is the cell cells() then shows the mover's stone in
    for (int col = 0; col < 5; ++col) {
        Connect4 next = state;
        next.play(col);
        std::vector<int8_t> cells(20);
        next.cells(cells);
        EXPECT_EQ(cells[static_cast<size_t>(state.action_cell(col))], ms::games::kCellOpponent) << col;
    }
    // a full column: its top cell
    EXPECT_EQ(Connect4::from_moves(4, 5, "1111").action_cell(0), 0);
}

// cell_flags against the rules played out: a cell is playable where some legal move's stone lands, and it wins for
// a side where that side's stone there (the board's other stones as they are) makes four -- checked by placing the
// stone and asking has_four, on every board size and many random positions.
TEST(Connect4, CellFlagsAreWhereAStoneLandsAndWhereOneCompletesFour) {
    for (const auto& [rows, cols] : std::vector<std::pair<int, int>>{{4, 4}, {4, 5}, {5, 6}, {6, 7}, {8, 7}, {6, 9}}) {
        for (uint64_t seed = 0; seed < 60; ++seed) {
            Connect4 state = Connect4::empty(rows, cols);
            const int plies = static_cast<int>(seed % static_cast<uint64_t>(rows * cols - 1));
            for (int p = 0; p < plies && state.outcome() == Outcome::kOngoing; ++p)
                state.play(ms::games::random_move(state, seed * 1000 + static_cast<uint64_t>(p)));
            if (state.outcome() != Outcome::kOngoing) continue;  // a four already on the board: no position to flag
            std::vector<int8_t> flags(static_cast<size_t>(rows * cols), -1);
            state.cell_flags(flags);
            const uint64_t mine = state.current_stones(), theirs = state.current_stones() ^ state.all_stones();
            for (int r = 0; r < rows; ++r)
                for (int c = 0; c < cols; ++c) {
                    SCOPED_TRACE(state.to_string() + " cell " + std::to_string(r * cols + c));
                    const uint64_t bit = uint64_t{1} << Connect4::bit_index(rows, c, rows - 1 - r);
                    const bool empty = !(state.all_stones() & bit);
                    const bool lands = empty && state.is_legal(c) && state.action_cell(c) == r * cols + c;
                    const int8_t expected = static_cast<int8_t>(
                        (lands ? Connect4::kFlagPlayable : 0) |
                        (empty && Connect4::has_four(mine | bit, rows) ? Connect4::kFlagToMoveWins : 0) |
                        (empty && Connect4::has_four(theirs | bit, rows) ? Connect4::kFlagOpponentWins : 0));
                    EXPECT_EQ(flags[static_cast<size_t>(r * cols + c)], expected);
                }
        }
    }
}

TEST(Connect4, KeyIsExact) {
    // Every position of the first 9 plies on 4 x 5: one key per board and one board per key.
    std::unordered_map<uint64_t, std::string> board_of;
    std::unordered_map<std::string, uint64_t> key_of;
    std::vector<Connect4> frontier = {Connect4::empty(4, 5)};
    for (int ply = 0; ply <= 9; ++ply) {
        std::vector<Connect4> next;
        for (const Connect4& state : frontier) {
            const std::string board = state.to_string();
            const auto [at_key, new_key] = board_of.emplace(state.key(), board);
            const auto [at_board, new_board] = key_of.emplace(board, state.key());
            EXPECT_EQ(at_key->second, board);
            EXPECT_EQ(at_board->second, state.key());
            if (!new_key || state.is_terminal()) continue;
            for (int c = 0; c < state.cols(); ++c) {
                if (!state.is_legal(c)) continue;
                Connect4 child = state;
                child.play(c);
                next.push_back(child);
            }
        }
        frontier = std::move(next);
    }
    EXPECT_EQ(board_of.size(), key_of.size());
    EXPECT_GT(board_of.size(), 10000u);
}

TEST(Connect4, BoardSizesOutsideTheBitboardAreRefusedWithASentence) {
    EXPECT_EQ(user_error([] { Connect4::empty(3, 7); }),
              "game error: connect4 cannot be played on a board of 3 rows x 7 columns: rows must be 4..8; the largest "
              "boards are 8 x 7, 7 x 8 and 6 x 9, the standard one 6 x 7");
    EXPECT_NE(user_error([] { Connect4::empty(9, 4); }).find("9 rows x 4 columns: rows must be 4..8;"),
              std::string::npos);
    EXPECT_NE(user_error([] { Connect4::empty(6, 3); }).find("6 rows x 3 columns: columns must be 4..9;"),
              std::string::npos);
    EXPECT_NE(user_error([] { Connect4::empty(4, 10); }).find("4 rows x 10 columns: columns must be 4..9;"),
              std::string::npos);
    EXPECT_NE(user_error([] {
                  Connect4::empty(8, 8);
              }).find("8 rows x 8 columns: (rows + 1) * columns = 72 is over the 64 bits of the bitboard"),
              std::string::npos);
    EXPECT_NE(user_error([] { Connect4::from_moves(7, 9, ""); }).find("(rows + 1) * columns = 72"), std::string::npos);
    for (const auto [rows, cols] : all_sizes()) {
        const Connect4 state = Connect4::empty(rows, cols);
        EXPECT_EQ(state.rows(), rows);
        EXPECT_EQ(state.cols(), cols);
        EXPECT_EQ(state.num_actions(), cols);
        EXPECT_EQ(state.legal_moves(), (uint64_t{1} << cols) - 1);
    }
    EXPECT_EQ(all_sizes().size(), 27u);  // 4..8 rows x 4..9 columns, less 7 x 9, 8 x 8 and 8 x 9
}

TEST(GameSpec, NamesAGameAndAChecksItsBoard) {
    const ms::games::GameSpec spec = ms::games::game_spec("connect4", 5, 6);
    EXPECT_EQ(spec.kind, ms::games::GameKind::kConnect4);
    EXPECT_EQ(spec.rows, 5);
    EXPECT_EQ(spec.cols, 6);
    EXPECT_EQ(ms::games::game_name(spec.kind), "connect4");
    EXPECT_EQ(user_error([] { ms::games::game_spec("chess", 6, 7); }),
              "game error: unknown game 'chess': the games are: connect4");
    EXPECT_EQ(user_error([] { ms::games::game_spec("connect4", 6, 10); }), user_error([] { Connect4::empty(6, 10); }));
}

TEST(RandomPlayer, PlaysLegalMovesDrawnFromTheSeedAndPosition) {
    const Connect4 state = Connect4::from_moves(6, 7, "111111");
    std::array<int, 7> seen{};
    for (uint64_t seed = 0; seed < 300; ++seed) {
        const int move = ms::games::random_move(state, seed);
        ASSERT_TRUE(state.is_legal(move));
        EXPECT_EQ(ms::games::random_move(state, seed), move);
        ++seen[move];
    }
    EXPECT_EQ(seen[0], 0);
    for (int c = 1; c < 7; ++c) EXPECT_GT(seen[c], 25) << c;  // 50 expected of each
}

// ---- alpha-beta ----

// Plain minimax of Connect Four on a 2-D array, memoised by a base-3 board code: the Pons score of the side to
// move (alpha_beta.h), computed without bitboards, move ordering or pruning.
class Minimax {
  public:
    Minimax(int rows, int cols, const std::string& moves)
        : rows_(rows), cols_(cols), cell_(rows * cols, 0), height_(cols, 0) {
        for (const char ch : moves) place(ch - '1');
    }

    int score() {
        uint64_t code = 0;
        for (const int8_t v : cell_) code = code * 3 + v;
        if (const auto it = memo_.find(code); it != memo_.end()) return it->second;
        int best = -1000;
        for (int c = 0; c < cols_; ++c) {
            if (height_[c] == rows_) continue;
            const int before = moves_;
            const bool won = place(c);
            const int value = won ? (rows_ * cols_ + 1 - before) / 2 : moves_ == rows_ * cols_ ? 0 : -score();
            unplace(c);
            best = std::max(best, value);
        }
        memo_.emplace(code, best);
        return best;
    }
    // The score after the side to move plays `col`, from its view.
    int score_of(int col) {
        const int before = moves_;
        const bool won = place(col);
        const int value = won ? (rows_ * cols_ + 1 - before) / 2 : moves_ == rows_ * cols_ ? 0 : -score();
        unplace(col);
        return value;
    }

  private:
    int8_t& at(int col, int row) { return cell_[row * cols_ + col]; }
    // Drops the side to move's stone in `col`; whether it makes four.
    bool place(int col) {
        const int row = height_[col]++;
        const int8_t me = static_cast<int8_t>(1 + moves_ % 2);
        at(col, row) = me;
        ++moves_;
        for (const auto [dc, dr] : {std::array<int, 2>{1, 0}, {0, 1}, {1, 1}, {1, -1}}) {
            int run = 1;
            for (const int sign : {1, -1}) {
                for (int c = col + sign * dc, r = row + sign * dr;
                     c >= 0 && c < cols_ && r >= 0 && r < rows_ && at(c, r) == me; c += sign * dc, r += sign * dr) {
                    ++run;
                }
            }
            if (run >= 4) return true;
        }
        return false;
    }
    void unplace(int col) {
        at(col, --height_[col]) = 0;
        --moves_;
    }

    int rows_, cols_, moves_ = 0;
    std::vector<int8_t> cell_;
    std::vector<int> height_;
    std::unordered_map<uint64_t, int> memo_;
};

TEST(AlphaBeta, TakesAnImmediateWin) {
    AlphaBeta search;
    const Connect4 state = Connect4::from_moves(6, 7, "112233");
    for (const int depth : {1, 4, 0}) {
        const SearchResult r = search.search(state, {depth, TieBreak::kCentre, 0});
        EXPECT_EQ(r.move, 3);
        EXPECT_EQ(r.best_moves, 0b0001000u);
        EXPECT_EQ(r.score, kWinScore + 18);  // X's 4th stone: 17 left of 21, + 1
        EXPECT_EQ(ms::games::solver_score(r.score), 18);
    }
}

TEST(AlphaBeta, BlocksTheOpponentsThreatAndSeesDoubleThreats) {
    AlphaBeta search;
    // X threatens the 4th column's bottom cell; O must take it.
    for (const int depth : {1, 2, 4}) {
        const SearchResult r = search.search(Connect4::from_moves(6, 7, "11223"), {depth, TieBreak::kCentre, 0});
        EXPECT_EQ(r.move, 3) << depth;
        EXPECT_EQ(r.best_moves, 0b0001000u) << depth;
    }
    // X makes an open three on the bottom row (columns 2..4, both ends empty): a win with its 4th stone, at any
    // depth, and the only move that wins that soon.
    for (const int depth : {1, 3, 0}) {
        const SearchResult r = search.search(Connect4::from_moves(6, 7, "2636"), {depth, TieBreak::kCentre, 0});
        EXPECT_EQ(r.move, 3) << depth;
        EXPECT_EQ(r.best_moves, 0b0001000u) << depth;
        EXPECT_EQ(r.score, kWinScore + 18) << depth;
    }
    // O faces that open three: every move loses to X's next stone.
    const SearchResult lost = search.search(Connect4::from_moves(6, 7, "22334"), {4, TieBreak::kCentre, 0});
    EXPECT_EQ(lost.score, -(kWinScore + 18));
    EXPECT_EQ(lost.best_moves, 0b1111111u);
    EXPECT_EQ(lost.move, 3);
}

TEST(AlphaBeta, FullSolveMatchesPlainMinimax) {
    struct Case {
        int rows, cols;
        const char* moves;
    };
    const Case cases[] = {{4, 4, ""},       {4, 4, "2"},       {4, 4, "1442142"}, {4, 4, "13242"}, {4, 4, "22232"},
                          {4, 5, "1234"},   {4, 5, "3323"},    {4, 5, "55123"},   {4, 5, "44135"}, {4, 5, "3213325"},
                          {4, 5, "32323"},  {4, 5, "5312134"}, {5, 4, "2323"},    {5, 4, "1441"},  {5, 4, "22413"},
                          {5, 4, "424114"}, {5, 4, "3243441"}, {5, 4, "442433"}};
    AlphaBeta search;
    int nonzero = 0;
    for (const Case& c : cases) {
        SCOPED_TRACE(testing::Message() << c.rows << " x " << c.cols << " '" << c.moves << "'");
        Minimax minimax(c.rows, c.cols, c.moves);
        const int expected = minimax.score();
        const SearchResult r = search.search(Connect4::from_moves(c.rows, c.cols, c.moves), {});
        EXPECT_EQ(ms::games::solver_score(r.score), expected);
        EXPECT_EQ(r.score == 0, expected == 0);
        // best_moves is exactly the set of moves that achieve the score.
        for (int col = 0; col < c.cols; ++col) {
            if (Connect4::from_moves(c.rows, c.cols, c.moves).is_legal(col)) {
                EXPECT_EQ(bool(r.best_moves >> col & 1), minimax.score_of(col) == expected) << "column " << col;
            }
        }
        nonzero += expected != 0;
    }
    EXPECT_GE(nonzero, 10);  // the cases hold wins and losses, not only draws
}

TEST(AlphaBeta, SolvesTheSmallBoardsFromEmpty) {
    // Both are draws (John Tromp's table of Connect Four results; the minimax above agrees, but takes longer than
    // this suite should), and so are the first player's best moves.
    AlphaBeta search;
    for (const auto [rows, cols] : {std::array<int, 2>{4, 5}, {5, 4}}) {
        const SearchResult r = search.search(Connect4::empty(rows, cols), {});
        EXPECT_EQ(r.score, 0) << rows << " x " << cols;
        EXPECT_TRUE(r.best_moves >> r.move & 1);
    }
}

TEST(AlphaBeta, DepthLimitedSearchIsDeterministic) {
    const std::array<const char*, 4> positions = {"", "4453", "44444", "3452167"};
    std::vector<SearchResult> first;
    AlphaBeta a(16);
    for (const char* moves : positions) first.push_back(a.search(Connect4::from_moves(6, 7, moves), {4}));
    // A second searcher, and the first one again after other searches: the same results, node counts included.
    AlphaBeta b(16);
    b.search(Connect4::from_moves(5, 6, "3344"), {6});
    for (size_t i = 0; i < positions.size(); ++i) {
        for (AlphaBeta* s : {&a, &b}) {
            const SearchResult r = s->search(Connect4::from_moves(6, 7, positions[i]), {4});
            EXPECT_EQ(r.move, first[i].move) << positions[i];
            EXPECT_EQ(r.score, first[i].score) << positions[i];
            EXPECT_EQ(r.best_moves, first[i].best_moves) << positions[i];
            EXPECT_EQ(r.nodes, first[i].nodes) << positions[i];
        }
        EXPECT_GT(first[i].nodes, 1u);
        EXPECT_LT(std::abs(first[i].score), kWinScore) << positions[i];  // heuristic: nothing forced within 4 plies
    }
    EXPECT_EQ(first[0].move, 3);  // the centre
}

TEST(AlphaBeta, TiesBreakToTheCentreOrByTheSeed) {
    // The empty board of an even width: reflection pairs the columns, so best_moves holds pairs of them.
    AlphaBeta search;
    const Connect4 empty = Connect4::empty(4, 4);
    const SearchResult centre = search.search(empty, {});
    const uint64_t best = centre.best_moves;
    ASSERT_GE(std::popcount(best), 2);
    for (int c = 0; c < 4; ++c) EXPECT_EQ(best >> c & 1, best >> (3 - c) & 1) << c;
    EXPECT_EQ(centre.move, (best & 0b0110) ? 1 : 0);  // the left one of the centre pair, else of the edge pair
    uint64_t drawn = 0;
    for (uint64_t seed = 0; seed < 32; ++seed) {
        const SearchResult r = search.search(empty, {0, TieBreak::kRandom, seed});
        EXPECT_EQ(r.best_moves, best);
        EXPECT_EQ(r.score, centre.score);
        EXPECT_EQ(search.search(empty, {0, TieBreak::kRandom, seed}).move, r.move);
        drawn |= uint64_t{1} << r.move;
    }
    EXPECT_EQ(drawn, best);
}

TEST(AlphaBeta, DepthFourBeatsTheRandomPlayer) {
    AlphaBeta search(16);
    int wins = 0;
    for (int game = 0; game < 20; ++game) {
        const int searcher = game % 2;  // the side alpha-beta plays: first in even games
        Connect4 state;
        while (!state.is_terminal()) {
            const int move = state.side_to_move() == searcher
                                 ? search.search(state, {4, TieBreak::kRandom, uint64_t(game)}).move
                                 : ms::games::random_move(state, 1000 + game);
            state.play(move);
        }
        wins += state.outcome() == Outcome::kLoss && state.side_to_move() != searcher;
    }
    EXPECT_EQ(wins, 20);
}

TEST(Connect4, BitboardsRoundTrip) {
    // Every position of random games on every board comes back from its bitboards, move count included.
    int positions = 0;
    for (const auto& [rows, cols] : all_sizes()) {
        for (uint64_t game = 0; game < 8; ++game) {
            Connect4 state = Connect4::empty(rows, cols);
            while (true) {
                EXPECT_EQ(Connect4::from_bitboards(rows, cols, state.current_stones(), state.all_stones()), state)
                    << rows << " x " << cols << "\n"
                    << state.to_string();
                ++positions;
                if (state.is_terminal()) break;
                state.play(ms::games::random_move(state, game));
            }
        }
    }
    EXPECT_GT(positions, 27 * 8 * 7);  // no game ends before its seventh stone
}

TEST(Connect4, BitboardsThatAreNoPositionAreRefused) {
    const auto bit = [](int col, int row) { return uint64_t{1} << Connect4::bit_index(6, col, row); };
    // "445" on 6 x 7: X in columns 4 and 5 (0-based 3, 4), O on top of X in column 4; O to move
    const Connect4 state = Connect4::from_moves(6, 7, "445");
    const uint64_t current = state.current_stones(), all = state.all_stones();
    ASSERT_EQ(all, bit(3, 0) | bit(3, 1) | bit(4, 0));
    ASSERT_EQ(current, bit(3, 1));
    const auto refusal = [](int rows, int cols, uint64_t current, uint64_t all) {
        return user_error([&] { Connect4::from_bitboards(rows, cols, current, all); });
    };
    EXPECT_EQ(refusal(3, 7, current, all),
              "game error: connect4 cannot be played on a board of 3 rows x 7 columns: rows must be 4..8; the largest "
              "boards are 8 x 7, 7 x 8 and 6 x 9, the standard one 6 x 7");
    EXPECT_EQ(
        refusal(6, 7, current, all | bit(2, 6)),
        "game error: connect4 bitboards (current 0x400000, all 0x10700000) on a 6 x 7 board are no position: bit 20 "
        "holds a stone but is a column's empty top bit (a column holds rows + 1 = 7 bits, the top one empty)");
    EXPECT_EQ(
        refusal(6, 7, current, all | bit(7, 0)),
        "game error: connect4 bitboards (current 0x400000, all 0x2000010600000) on a 6 x 7 board are no position: "
        "bit 49 holds a stone but is past the last column (a column holds rows + 1 = 7 bits, the top one "
        "empty)");
    EXPECT_EQ(
        refusal(6, 7, current, all | bit(0, 1)),
        "game error: connect4 bitboards (current 0x400000, all 0x10600002) on a 6 x 7 board are no position: the stone "
        "in column 1, row 2 (from 1, the bottom row 1) is above an empty cell, but stones stack from the bottom");
    EXPECT_EQ(
        refusal(6, 7, current | bit(0, 0), all),
        "game error: connect4 bitboards (current 0x400001, all 0x10600000) on a 6 x 7 board are no position: the side "
        "to move has stones where `all` has none (current must be a subset of all)");
    // the side to move holding X's two stones instead of O's one
    EXPECT_EQ(
        refusal(6, 7, current ^ all, all),
        "game error: connect4 bitboards (current 0x10200000, all 0x10600000) on a 6 x 7 board are no position: the "
        "side to move has 2 of the 3 stones, where it must have 1 (half, rounded down)");
    // X (to move: 8 stones) has four in column 1 and O four in column 2: X's four would have ended the game
    const uint64_t x = bit(0, 0) | bit(0, 1) | bit(0, 2) | bit(0, 3), o = x << 7;
    EXPECT_EQ(refusal(6, 7, x, x | o),
              "game error: connect4 bitboards (current 0xf, all 0x78f) on a 6 x 7 board are no position: the side "
              "to move has four in a line, so the game ended before the last move");
    // X's four with three O stones and O to move is a finished game, not an error
    const uint64_t o3 = o & ~bit(1, 3);
    EXPECT_TRUE(Connect4::from_bitboards(6, 7, o3, x | o3).last_mover_won());
}

}  // namespace
