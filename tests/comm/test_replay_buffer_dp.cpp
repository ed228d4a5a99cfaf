// test_replay_buffer_dp.cpp: engine/selfplay/replay_buffer.h's add_from_all_ranks over real data-parallel groups
// against one rank that played all of the games (a plain add in rank order, computed on every rank).
//
// The world splits into groups of dp consecutive ranks for every dp that divides the world size (1, 2, 4, 8 under
// mpiexec -n 8). In each round, rank r of a group plays a different number of positions (0 for some ranks, some
// rounds none at all), the next block of the round's positions in rank order; the capacity is below what the rounds
// add, so the window drops positions too. What must match the one rank, bit for bit, after every round: the whole
// buffer, and the training batch the ranks draw slice by slice.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/games/connect4.h"
#include "engine/games/game.h"
#include "engine/selfplay/replay_buffer.h"
#include "tests/comm/comm_test.h"

namespace ms::test {
namespace {

using games::Connect4;
using selfplay::Mirror;
using selfplay::ReplayBuffer;
using selfplay::ReplaySample;
using Position = ReplayBuffer::Position;

constexpr int kRows = 4, kCols = 5, kRounds = 4;

// Position k of the run: k % 9 random moves into a game (seed k), a policy and an outcome that tell k apart.
Position position(int k) {
    Position p;
    p.state = Connect4::empty(kRows, kCols);
    for (int m = 0; m < k % 9 && !p.state.is_terminal(); ++m) {
        p.state.play(games::random_move(p.state, static_cast<uint64_t>(k)));
    }
    for (int c = 0; c < kCols; ++c) p.policy.push_back(static_cast<float>((k * 13 + c) % 1000) / 1000.0f);
    p.value = static_cast<float>(k % 3 - 1);
    return p;
}

// How many positions rank r plays in round t: 0 to 6, different on neighbouring ranks; round 2 plays none.
int count(int r, int t) { return t == 2 ? 0 : (5 * r + 3 * t + 3) % 7; }

TEST(ReplayBufferDp, EveryRankHoldsWhatOneRankPlayingAllGamesHolds) {
    for (int dp = 1; dp <= world().size(); ++dp) {
        if (world().size() % dp != 0) continue;
        SCOPED_TRACE("dp " + std::to_string(dp));
        std::unique_ptr<Communicator> group = world().split(world().rank() / dp, world().rank() % dp, "dp");
        ReplayBuffer mine(kRows, kCols, 9), one(kRows, kCols, 9);
        int next = 0;  // the round's first position
        for (int t = 0; t < kRounds; ++t) {
            SCOPED_TRACE("round " + std::to_string(t));
            std::vector<Position> played;
            for (int r = 0; r < dp; ++r) {
                std::vector<Position> block;
                for (int j = 0; j < count(r, t); ++j) block.push_back(position(next++));
                one.add(block);
                if (r == group->rank()) played = block;
            }
            mine.add_from_all_ranks(*group, played);
            EXPECT_TRUE(mine == one);
            EXPECT_EQ(mine.total_added(), next);

            // rank r draws its slice of the global batch; together they are the one rank's batch
            constexpr int64_t kLocal = 6;
            const ReplaySample part = mine.sample_slice(7, t, group->rank() * kLocal, kLocal);
            std::vector<int32_t> local;
            for (int64_t i = 0; i < kLocal; ++i) {
                local.push_back(static_cast<int32_t>(2 * part.index[i] + (part.mirror[i] == Mirror::kMirrored)));
            }
            std::vector<int32_t> global(local.size() * static_cast<size_t>(dp));
            group->all_gather(std::span<const int32_t>(local), std::span<int32_t>(global)).wait();
            const ReplaySample whole = one.sample(kLocal * dp, 7, t);
            for (size_t i = 0; i < global.size(); ++i) {
                EXPECT_EQ(global[i], 2 * whole.index[i] + (whole.mirror[i] == Mirror::kMirrored)) << i;
            }
        }
    }
}

}  // namespace
}  // namespace ms::test
