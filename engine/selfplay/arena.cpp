// arena.cpp: evaluation matches (arena.h): every game advanced one move per step, the searching players' moves of a
// step in one batched search each.
#include "engine/selfplay/arena.h"

#include <fmt/format.h>

#include <array>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/core/check.h"
#include "engine/core/philox.h"
#include "engine/games/alpha_beta.h"
#include "engine/selfplay/self_play.h"

namespace ms::selfplay {

namespace {

// The seed of side `side` (0: `player`, 1: `opponent`) in game `game`: 64 Philox bits of (seed, game, side).
uint64_t player_seed(uint64_t seed, uint64_t game, int side) {
    const uint64_t index = draw_index(0, DrawPurpose::kPlayerSeed, static_cast<uint32_t>(side));
    const PhiloxCounter r = philox4x32_10({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                                           static_cast<uint32_t>(game), static_cast<uint32_t>(game >> 32)},
                                          {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
    return (static_cast<uint64_t>(r[0]) << 32) | r[1];
}

// One side of a match, with what it needs to move.
struct Side {
    const Player* player = nullptr;
    std::optional<BatchedSearch<games::Connect4>> search;  // kAgent
    std::vector<SearchRoot<games::Connect4>> roots;        // this step's, for kAgent
};

}  // namespace

std::string Player::name() const {
    switch (kind) {
        case PlayerKind::kRandom:
            return "random";
        case PlayerKind::kAlphaBeta:
            return depth > 0 ? fmt::format("alpha-beta depth {}", depth) : "alpha-beta solver";
        case PlayerKind::kAgent:
            return fmt::format("mcts {} simulations", mcts.simulations);
    }
    MS_UNREACHABLE("player kind {}", static_cast<int>(kind));
}

int count_distinct(const std::vector<std::string>& moves) {
    return static_cast<int>(std::set<std::string>(moves.begin(), moves.end()).size());
}

MatchResult play_match(const Player& player, const Player& opponent, int rows, int cols, int game_count, uint64_t seed,
                       int opening_moves, GameRange games) {
    if (game_count < 1) {
        throw UserError(fmt::format(
            "config error: selfplay.eval_games = {} must be >= 1: an evaluation match plays at least one game",
            game_count));
    }
    const int begin = games.begin, end = games.end < 0 ? game_count : games.end;
    MS_CHECK(0 <= begin && begin <= end && end <= game_count, "games [{}, {}) of a match of {}", begin, end,
             game_count);
    const games::Connect4 empty = games::Connect4::empty(rows, cols);
    std::array<Side, 2> sides;
    sides[0].player = &player;
    sides[1].player = &opponent;
    std::optional<games::AlphaBeta> alpha_beta;
    for (Side& side : sides) {
        switch (side.player->kind) {
            case PlayerKind::kRandom:
                break;
            case PlayerKind::kAlphaBeta:
                if (!alpha_beta) alpha_beta.emplace();
                break;
            case PlayerKind::kAgent:
                MS_CHECK(side.player->evaluator != nullptr, "a searching player without an evaluator");
                side.search.emplace(side.player->mcts, seed);
                break;
        }
    }

    // Game g of the match is states[g - begin].
    std::vector<games::Connect4> states(end - begin, empty);
    MatchResult result;
    result.moves.resize(end - begin);
    const auto play = [&](int g, int action) {
        states[g - begin].play(action);
        result.moves[g - begin] += static_cast<char>('1' + action);
    };
    // `player` (side 0) moves first in even games: at move m of game g the side to move is (m + g) & 1.
    const auto side_to_move = [&](int g) { return (states[g - begin].move_count() + g) & 1; };
    for (;;) {
        bool ongoing = false;
        for (int g = begin; g < end; ++g) {
            const games::Connect4& state = states[g - begin];
            if (state.outcome() != games::Outcome::kOngoing) continue;
            ongoing = true;
            if (state.move_count() < opening_moves) {  // the pair's opening: one seed for games 2i and 2i + 1
                play(g, games::random_move(state, player_seed(seed, static_cast<uint64_t>(g / 2), 2)));
                continue;
            }
            const int s = side_to_move(g);
            Side& side = sides[s];
            switch (side.player->kind) {
                case PlayerKind::kRandom:
                    play(g, games::random_move(state, player_seed(seed, g, s)));
                    break;
                case PlayerKind::kAlphaBeta:
                    play(g, alpha_beta
                                ->search(state, {side.player->depth, games::TieBreak::kRandom, player_seed(seed, g, s)})
                                .move);
                    break;
                case PlayerKind::kAgent:
                    side.roots.push_back({state, static_cast<uint64_t>(g)});
                    break;
            }
        }
        if (!ongoing) break;
        for (Side& side : sides) {
            if (side.roots.empty()) continue;
            const std::vector<RootResult> results = side.search->run(*side.player->evaluator, side.roots);
            for (size_t i = 0; i < results.size(); ++i) {
                play(static_cast<int>(side.roots[i].game), most_visited(results[i]));
            }
            side.roots.clear();
        }
    }

    for (int g = begin; g < end; ++g) {
        const games::Connect4& state = states[g - begin];
        Tally& colour = g % 2 == 0 ? result.as_first : result.as_second;
        // A finished game's side to move has lost or drawn; that side is `player` when side_to_move(g) is 0.
        if (state.outcome() == games::Outcome::kDraw) {
            ++colour.draws;
        } else if (side_to_move(g) == 0) {
            ++colour.losses;
        } else {
            ++colour.wins;
        }
    }
    result.total = result.as_first + result.as_second;
    result.distinct_games = count_distinct(result.moves);
    for (const Side& side : sides) {
        if (side.search) result.search += side.search->counters();
    }
    return result;
}

}  // namespace ms::selfplay
