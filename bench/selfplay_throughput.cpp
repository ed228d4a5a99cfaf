// selfplay_throughput.cpp: positions the self-play network evaluates per second, with the tree search batched (many
// games advancing together, several leaves per tree per wave under virtual loss) against one leaf at a time (one
// game, one leaf per wave: a forward per simulation), measured side by side in one run on the same network.
//   build/selfplay_throughput [layers hidden heads ffn] [rows cols] [simulations] [threads]
// Defaults: configs/alphazero-connect4.yaml's network (2 layers, 64 wide, 4 heads, ffn 128) on 6 x 7, 64
// simulations per move, the backend's default threads. Each mode plays whole self-play games (play_games) and
// reports positions evaluated per second and the forwards it took; the batched mode plays 32 games with 4 leaves
// per wave, the serial one as many moves as it takes to run for a comparable time.
#include <fmt/format.h>

#include <cstdlib>
#include <memory>

#include "comm/process_groups.h"
#include "comm/self_communicator.h"
#include "engine/backends/backend.h"
#include "engine/core/timer.h"
#include "engine/model/policy_value.h"
#include "engine/selfplay/policy_value_net.h"
#include "engine/selfplay/self_play.h"

int main(int argc, char** argv) {
    using namespace ms;
    const auto arg = [&](int i, int fallback) { return argc > i ? std::atoi(argv[i]) : fallback; };
    const PolicyValueSizes sizes{.layers = arg(1, 2),
                                 .hidden = arg(2, 64),
                                 .heads = arg(3, 4),
                                 .ffn = arg(4, 128),
                                 .board_rows = arg(5, 6),
                                 .board_cols = arg(6, 7)};
    const int simulations = arg(7, 64);
    SelfCommunicator world("world");
    ProcessGroups groups = make_process_groups(world, Topology{});
    BackendOptions bo;
    bo.num_threads = arg(8, 0);
    std::unique_ptr<Backend> backend = make_backend(bo);
    const GptShape shape = policy_value_shape(sizes);
    struct Mode {
        const char* name;
        int games, leaves_per_wave;
    };
    const Mode modes[] = {{"batched", 32, 4}, {"one leaf at a time", 1, 1}};
    fmt::print("selfplay_throughput: network {} layers x {} ({} heads, ffn {}) on {} x {}, {} simulations per move\n",
               sizes.layers, sizes.hidden, sizes.heads, sizes.ffn, sizes.board_rows, sizes.board_cols, simulations);
    fmt::print("{:<20} {:>6} {:>8} {:>12} {:>10} {:>12} {:>10}\n", "mode", "games", "moves", "positions", "forwards",
               "rows/forward", "pos/s");
    double rates[2] = {0, 0};
    for (int m = 0; m < 2; ++m) {
        const Mode& mode = modes[m];
        selfplay::PolicyValueNet net(shape, *backend, groups, mode.games * mode.leaves_per_wave);
        net.init_weights(1, 0.05f);
        selfplay::SelfPlayOptions o;
        o.mcts.simulations = simulations;
        o.mcts.leaves_per_wave = mode.leaves_per_wave;
        // warm-up: the first forwards compile the programs of their batch sizes
        selfplay::play_games(net, sizes.board_rows, sizes.board_cols, o, 7, 1000, mode.games);
        const double t0 = now_seconds();
        int64_t positions = 0, calls = 0, moves = 0, games = 0;
        for (uint64_t first = 0; now_seconds() - t0 < 10.0 || games == 0; first += static_cast<uint64_t>(mode.games)) {
            const selfplay::SelfPlayGames g =
                selfplay::play_games(net, sizes.board_rows, sizes.board_cols, o, 7, first, mode.games);
            positions += g.stats.positions_evaluated;
            calls += g.stats.evaluate_calls;
            moves += g.stats.moves;
            games += g.stats.games;
        }
        const double seconds = now_seconds() - t0;
        rates[m] = static_cast<double>(positions) / seconds;
        fmt::print("{:<20} {:>6} {:>8} {:>12} {:>10} {:>12.1f} {:>10.0f}\n", mode.name, games, moves, positions, calls,
                   static_cast<double>(positions) / static_cast<double>(calls), rates[m]);
    }
    fmt::print("batched / one leaf at a time: {:.1f}x positions per second\n", rates[0] / rates[1]);
    return 0;
}
