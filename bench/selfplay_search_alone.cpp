// selfplay_search_alone.cpp: how strong the tree search is with no network, as a yardstick for the trained agent's
// evaluation matches (docs/selfplay.md): the search of engine/selfplay/mcts.h with uniform priors and, as each leaf's
// value, the mean result of random playouts, against alpha-beta to a depth, on one board, at several simulation
// counts. Played as the trainer's final evaluation is: games in pairs from the same random opening plies, one per
// colour, the most visited move, no root noise. Then, as the other yardstick, alpha-beta searching deeper (the
// depths of MS_BENCH_DEPTHS, default "6 8 10") against the same opponent in the same openings: what a tactically
// stronger player wins there, some of the openings being lost for one colour whatever it plays.
//   build/selfplay_search_alone [depth] [games] [playouts per leaf] [rows cols] [simulations...]
// Defaults: depth 4, 200 games, 8 playouts, 6 x 7, simulations 400 1600 6400.
#include <fmt/format.h>

#include <sstream>
#include <string>

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "engine/core/timer.h"
#include "engine/games/connect4.h"
#include "engine/selfplay/arena.h"

namespace {

using ms::games::Connect4;

// Uniform priors over the legal moves; the value, for the side to move, the mean of `playouts` random games from the
// position, each seeded by (position, playout).
class RandomPlayouts final : public ms::selfplay::Evaluator<Connect4> {
  public:
    explicit RandomPlayouts(int playouts) : playouts_(playouts) {}

    void evaluate(std::span<const Connect4> positions, std::span<float> priors, std::span<float> values) override {
        for (size_t i = 0; i < positions.size(); ++i) {
            const Connect4& state = positions[i];
            const uint64_t legal = state.legal_moves();
            const size_t actions = static_cast<size_t>(state.num_actions());
            for (size_t a = 0; a < actions; ++a)
                priors[i * actions + a] = (legal >> a) & 1 ? 1.0f / static_cast<float>(std::popcount(legal)) : 0.0f;
            int total = 0;
            for (int r = 0; r < playouts_; ++r) {
                // random_move draws from (seed, position): one seed per (start, playout) varies every move
                const uint64_t seed = state.key() ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(r + 1));
                Connect4 game = state;
                while (game.outcome() == ms::games::Outcome::kOngoing) game.play(ms::games::random_move(game, seed));
                // The last mover won a decided game: the side to move at `state` when it made an odd number of moves.
                if (game.outcome() != ms::games::Outcome::kDraw)
                    total += (game.move_count() - state.move_count()) % 2 == 1 ? 1 : -1;
            }
            values[i] = static_cast<float>(total) / static_cast<float>(playouts_);
        }
    }
    int max_batch() const override { return 1024; }

  private:
    int playouts_;
};

}  // namespace

int main(int argc, char** argv) {
    using namespace ms;
    const auto arg = [&](int i, int fallback) { return argc > i ? std::atoi(argv[i]) : fallback; };
    const int depth = arg(1, 4), games = arg(2, 200), playouts = arg(3, 8), rows = arg(4, 6), cols = arg(5, 7);
    std::vector<int> simulations;
    for (int i = 6; i < argc; ++i) simulations.push_back(std::atoi(argv[i]));
    if (simulations.empty()) simulations = {400, 1600, 6400};
    fmt::print(
        "selfplay_search_alone: MCTS, uniform priors, {} random playouts per leaf, vs alpha-beta depth {} on {} x "
        "{}, {} games (2-ply random openings, each played once per colour)\n",
        playouts, depth, rows, cols, games);
    fmt::print("{:>11} {:>6} {:>6} {:>6} {:>9} {:>9} {:>9} {:>8}\n", "simulations", "won", "drawn", "lost", "win rate",
               "as first", "as second", "seconds");
    for (const int s : simulations) {
        RandomPlayouts evaluator(playouts);
        selfplay::MctsOptions options;
        options.simulations = s;
        options.leaves_per_wave = 4;
        options.c_puct = 1.5f;  // engine/config/config.h's selfplay.c_puct
        const double t0 = now_seconds();
        const selfplay::MatchResult r =
            selfplay::play_match(selfplay::Player::agent(evaluator, options), selfplay::Player::alpha_beta(depth), rows,
                                 cols, games, /*seed=*/99, /*opening_moves=*/2);
        fmt::print("{:>11} {:>6} {:>6} {:>6} {:>8.1f}% {:>4}/{:<4} {:>4}/{:<4} {:>8.1f}\n", s, r.total.wins,
                   r.total.draws, r.total.losses, 100.0 * r.total.wins / r.total.games(), r.as_first.wins,
                   r.as_first.games(), r.as_second.wins, r.as_second.games(), now_seconds() - t0);
    }
    std::istringstream depths(std::getenv("MS_BENCH_DEPTHS") != nullptr ? std::getenv("MS_BENCH_DEPTHS") : "6 8 10");
    fmt::print("{:>11} {:>6} {:>6} {:>6} {:>9} {:>9} {:>9} {:>8}\n", "alpha-beta", "won", "drawn", "lost", "win rate",
               "as first", "as second", "seconds");
    for (int d; depths >> d;) {
        const double t0 = now_seconds();
        const selfplay::MatchResult r = selfplay::play_match(selfplay::Player::alpha_beta(d),
                                                             selfplay::Player::alpha_beta(depth), rows, cols, games,
                                                             /*seed=*/99, /*opening_moves=*/2);
        fmt::print("{:>11} {:>6} {:>6} {:>6} {:>8.1f}% {:>4}/{:<4} {:>4}/{:<4} {:>8.1f}\n", fmt::format("depth {}", d),
                   r.total.wins, r.total.draws, r.total.losses, 100.0 * r.total.wins / r.total.games(), r.as_first.wins,
                   r.as_first.games(), r.as_second.wins, r.as_second.games(), now_seconds() - t0);
    }
}
