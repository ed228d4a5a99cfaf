// game.h: the interface between two-player board games and what plays them (a search, a network, a trainer), and
// the factory that turns a game's name and board size into a checked GameSpec.
//
// A game state is a small trivially copyable value (a search copies it at every node) with, per the Game concept:
//   rows(), cols()         the board, for the network's input (rows * cols cells);
//   num_actions()          the policy's size (Connect Four: one action per column);
//   legal_moves()          bit a set: action a is legal now (so num_actions() <= 64);
//   play(a)                the side to move plays action a (a legal one of an unfinished game: else MS_CHECK);
//   outcome()              Outcome from the side to move's view (the one who just moved cannot have lost);
//   cells(out)             rows * cols cell codes (kCellEmpty / kCellToMove / kCellOpponent), row-major with the
//                          top row first: from the side to move's view, so one network plays both sides;
//   action_cell(a)         the cell (an index into cells()) action a puts a stone on: where a network that
//                          scores cells reads the action's logit;
//   key()                  an exact key of the position among positions of the same board size;
//   move_count(), to_string().
// Games are concrete types, not virtual classes: what plays them is a template over the Game concept, dispatched
// once on GameSpec::kind.
//
// Randomness is counter-based (engine/core/philox.h): a draw is a pure function of (seed, position key, purpose),
// so a game between seeded players replays exactly, with no generator state to carry or share.
#pragma once

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "engine/core/check.h"
#include "engine/core/philox.h"

namespace ms::games {

// A game's state from the side to move's view. A game ends on the move that makes it end, so the side to move of
// a finished game has lost (the other side completed a line) or drawn (the board is full).
enum class Outcome : int8_t { kOngoing, kLoss, kDraw };

// The value of a finished game for the side to move: -1 (lost) or 0 (drawn), a network's value target.
inline float outcome_value(Outcome outcome) {
    MS_CHECK(outcome != Outcome::kOngoing, "outcome_value of a game that is not over");
    return outcome == Outcome::kLoss ? -1.0f : 0.0f;
}

// The codes cells() writes: the network's per-cell input, independent of who moved first.
inline constexpr int8_t kCellEmpty = 0;
inline constexpr int8_t kCellToMove = 1;    // a stone of the side to move
inline constexpr int8_t kCellOpponent = 2;  // a stone of the side that just moved

template <typename G>
concept Game = std::is_trivially_copyable_v<G> && requires(const G game, G state, int action, std::span<int8_t> out) {
    { game.rows() } -> std::same_as<int>;
    { game.cols() } -> std::same_as<int>;
    { game.num_actions() } -> std::same_as<int>;
    { game.move_count() } -> std::same_as<int>;
    { game.legal_moves() } -> std::same_as<uint64_t>;
    { game.outcome() } -> std::same_as<Outcome>;
    { game.key() } -> std::same_as<uint64_t>;
    { game.action_cell(action) } -> std::same_as<int>;
    { game.to_string() } -> std::same_as<std::string>;
    game.cells(out);
    state.play(action);
};

enum class GameKind : uint8_t { kConnect4 };

// A game and its board, checked: what a config names and a curriculum changes.
struct GameSpec {
    GameKind kind = GameKind::kConnect4;
    int rows = 6;
    int cols = 7;
};

// The game named `name` ("connect4") on a rows x cols board. Throws UserError, naming the value and what is
// allowed, for an unknown name or a board the game cannot be played on.
GameSpec game_spec(std::string_view name, int rows, int cols);
std::string_view game_name(GameKind kind);

// The `index` values of the Philox draws below, one per purpose, so that two players given the same seed do not
// draw the same numbers in the same position.
inline constexpr uint64_t kDrawRandomMove = 0;
inline constexpr uint64_t kDrawTieBreak = 1;

// One of the set bits of `bits` (not 0), uniformly, as a pure function of (seed, stream, index).
inline int random_set_bit(uint64_t bits, uint64_t seed, uint64_t stream, uint64_t index) {
    MS_CHECK(bits != 0, "random_set_bit of an empty set");
    const int count = std::popcount(bits);
    const int pick = std::min(count - 1, static_cast<int>(philox_uniform_double(seed, stream, index) * count));
    for (int i = 0; i < pick; ++i) bits &= bits - 1;
    return std::countr_zero(bits);
}

// The random player: a legal action drawn uniformly, from (seed, position).
template <Game G>
int random_move(const G& game, uint64_t seed) {
    return random_set_bit(game.legal_moves(), seed, game.key(), kDrawRandomMove);
}

}  // namespace ms::games
