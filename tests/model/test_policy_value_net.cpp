// The self-play network (engine/model/policy_value.h, engine/selfplay/policy_value_net.h) on one rank: its input
// features, its gradients against central differences, batched evaluation equal to one position at a time, boards
// of several sizes through one set of weights, and a refused board.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "engine/backends/backend.h"
#include "engine/core/check.h"
#include "engine/core/philox.h"
#include "engine/games/connect4.h"
#include "engine/model/policy_value.h"
#include "engine/selfplay/policy_value_net.h"
#include "tests/common/central_differences.h"

namespace ms {
namespace {

using games::Connect4;
using selfplay::PolicyValueNet;

struct OneRankNet {
    SelfCommunicator world{"world"};
    ProcessGroups groups = make_process_groups(world, Topology{});
    std::unique_ptr<Backend> backend = make_backend({});
    GptShape shape;
    PolicyValueNet net;
    explicit OneRankNet(const PolicyValueSizes& sizes, int max_batch = 16)
        : shape(policy_value_shape(sizes)), net(shape, *backend, groups, max_batch) {
        net.init_weights(7, 0.2f);
    }
};

PolicyValueSizes tiny() { return {.layers = 2, .hidden = 16, .heads = 2, .ffn = 32, .board_rows = 6, .board_cols = 7}; }

// Positions from seeded random games of a board size, none over.
std::vector<Connect4> random_positions(int rows, int cols, int n, uint64_t seed) {
    std::vector<Connect4> out;
    for (uint64_t g = 0; static_cast<int>(out.size()) < n; ++g) {
        Connect4 s = Connect4::empty(rows, cols);
        const int moves = static_cast<int>(philox_uniform_double(seed, g, 99) * rows * cols * 0.6);
        for (int m = 0; m < moves && !s.is_terminal(); ++m) s.play(games::random_move(s, seed + g));
        if (!s.is_terminal()) out.push_back(s);
    }
    return out;
}

TEST(PolicyValueFeatures, EachCellIsItsCodeAndItsDistancesToTheEdges) {
    const GptShape s = policy_value_shape({.board_rows = 6, .board_cols = 7});
    const int width = policy_value_input_width(s);
    EXPECT_EQ(width, 3 + 6 + 6 + 7 + 7 + 1 + 2);
    // 4 x 5 after "3312": X to move; the bottom row is X . X O . from the first player's side
    const Connect4 state = Connect4::from_moves(4, 5, "3312");
    std::vector<int8_t> cells(20);
    state.cells(cells);
    std::vector<float> f(static_cast<size_t>(21 * width));
    write_board_features(s, 4, 5, cells, {}, state.move_count(), f);
    const auto ones = [&](int row) {
        std::vector<int> at;
        for (int k = 0; k < width; ++k)
            if (f[static_cast<size_t>(row * width + k)] != 0.0f) at.push_back(k);
        return at;
    };
    const int first_to_move = width - 2;  // 4 stones played: the first player's turn, on every row
    EXPECT_EQ(ones(0), (std::vector<int>{width - 3, first_to_move}));  // the summary row
    // cell (row 3 from the top = the bottom row, column 0): the side to move's stone; row 0 from the bottom, 3 from
    // the top, column 0 from the left, 4 from the right
    EXPECT_EQ(ones(1 + 3 * 5 + 0), (std::vector<int>{1, 3 + 0, 9 + 3, 15 + 0, 22 + 4, first_to_move}));
    // cell (top row, column 4): empty, row 3 from the bottom, 0 from the top, column 4 from the left, 0 from the right
    EXPECT_EQ(ones(1 + 0 * 5 + 4), (std::vector<int>{0, 3 + 3, 9 + 0, 15 + 4, 22 + 0, first_to_move}));
    // after a fifth stone, the second player's turn
    std::vector<float> g(f.size());
    const Connect4 next = Connect4::from_moves(4, 5, "33121");
    next.cells(cells);
    write_board_features(s, 4, 5, cells, {}, next.move_count(), g);
    EXPECT_EQ(g[static_cast<size_t>(width - 1)], 1.0f);
    EXPECT_EQ(g[static_cast<size_t>(width - 2)], 0.0f);
    for (float v : f) EXPECT_TRUE(v == 0.0f || v == 1.0f);
}

// With threat features, each empty cell also says (Connect4::cell_flags) whether a stone dropped now lands there and
// whether a stone of the side to move, or of the opponent, there completes four: along a row, a column and both
// diagonals.
TEST(PolicyValueFeatures, ThreatFeaturesMarkPlayableCellsAndLinesOfFour) {
    const GptShape plain = policy_value_shape({.board_rows = 6, .board_cols = 7});
    const GptShape s = policy_value_shape({.board_rows = 6, .board_cols = 7, .threat_features = true});
    const int width = policy_value_input_width(s), threats = policy_value_input_width(plain);
    EXPECT_EQ(width, threats + 3);
    const auto features = [&](const char* moves) {
        const Connect4 state = Connect4::from_moves(6, 7, moves);
        std::vector<int8_t> cells(42), flags(42);
        state.cells(cells);
        state.cell_flags(flags);
        std::vector<float> f(static_cast<size_t>(43 * width));
        write_board_features(s, 6, 7, cells, flags, state.move_count(), f);
        // the three threat columns of every cell, as "prt" strings per row from the top ('.' where 0)
        std::vector<std::string> rows(6);
        for (int r = 0; r < 6; ++r)
            for (int c = 0; c < 7; ++c) {
                const float* x = f.data() + static_cast<size_t>(1 + r * 7 + c) * width + threats;
                for (int k = 0; k < 3; ++k) {
                    EXPECT_TRUE(x[k] == 0.0f || x[k] == 1.0f);
                    rows[static_cast<size_t>(r)] += x[k] != 0.0f ? "prt"[k] : '.';
                }
                rows[static_cast<size_t>(r)] += ' ';
            }
        for (float v : std::span<const float>(f.data() + threats, 3)) EXPECT_EQ(v, 0.0f);  // the summary row: none
        return rows;
    };
    // 1 2 1 2 1 2 (Pons' columns from 1): the first player (to move) has three in column 1 and one more wins there;
    // the opponent has three in column 2, so it wins there too. Row 2 from the top holds both, each above its
    // column; the bottom's other five cells are playable.
    const std::vector<std::string> vertical = features("121212");
    EXPECT_EQ(vertical[2], "pr. p.t ... ... ... ... ... ");
    EXPECT_EQ(vertical[5], "... ... p.. p.. p.. p.. p.. ");
    EXPECT_EQ(vertical[0], "... ... ... ... ... ... ... ");
    // 1 7 2 7 3 7: the first player (to move) has three on the bottom row from the left, the opponent three in the
    // last column: the one completes four on the bottom row's fourth cell, the other on top of its column
    const std::vector<std::string> row = features("172737");
    EXPECT_EQ(row[5], "... ... ... pr. p.. p.. ... ");
    EXPECT_EQ(row[2], "... ... ... ... ... ... p.t ");
    // 1 2 2 3 3 4 3 4: the first player (to move) on a diagonal rising to the right from the bottom left corner,
    // completed at row 2 of column 3, not yet playable; the opponent's three on the bottom row complete at column 4
    const std::vector<std::string> diagonal = features("12233434");
    EXPECT_EQ(diagonal[2].substr(12, 4), ".r. ");
    EXPECT_EQ(diagonal[5].substr(16, 4), "p.t ");
    // 1 7 6 6 5 5 4 5 4: the second player (to move) on a diagonal falling to the right to the bottom right corner,
    // completed at row 2 of column 3; the first player's three on the bottom row complete at column 2
    const std::vector<std::string> falling = features("176655454");
    EXPECT_EQ(falling[2].substr(12, 4), ".r. ");
    EXPECT_EQ(falling[5].substr(8, 4), "p.t ");
    // without threat features, the input is the plain one
    EXPECT_EQ(policy_value_input_width(plain), 3 + 6 + 6 + 7 + 7 + 1 + 2);
}

TEST(PolicyValueNet, GradientsMatchCentralDifferences) {
    OneRankNet m(tiny(), 8);
    const std::vector<Connect4> states = random_positions(4, 5, 6, 3);
    std::vector<float> policies, outcomes;
    for (size_t i = 0; i < states.size(); ++i) {
        const uint64_t legal = states[i].legal_moves();
        std::vector<float> pi(5, 0.0f);
        float sum = 0;
        for (int a = 0; a < 5; ++a)
            if (legal >> a & 1) sum += pi[static_cast<size_t>(a)] = static_cast<float>(1 + (a + i) % 3);
        for (float& p : pi) policies.push_back(p / sum);
        outcomes.push_back(static_cast<float>(static_cast<int>(i % 3) - 1));
    }
    const auto loss = [&] { return static_cast<double>(m.net.train_step(states, policies, outcomes).loss); };
    loss();
    test::expect_central_differences(m.net, loss, {.h = 2e-3, .rel_tol = 2e-2, .abs_tol = 2e-4});
}

// Evaluating positions together gives what evaluating each alone gives, to within rounding: every op of the network
// works per row or per board, but OpenBLAS's sgemm kernels give a row bits that depend on the row count of the call
// and the row's place in it (engine/backends/cpu/ops/column_blocks.h), so the products round differently. Measured
// (this batch of 37 positions in chunks of 16, the default and Haswell kernels): priors and values within 3.3e-7 of
// each other. Self-play keeps its batches a function of the games alone (self-play groups, docs/selfplay.md), so that
// this rounding never depends on the layout.
TEST(PolicyValueNet, BatchedEvaluationIsOnePositionAtATimeToRounding) {
    OneRankNet m(tiny(), 16);
    float worst = 0;
    for (const auto& [rows, cols] : {std::pair{6, 7}, std::pair{4, 5}}) {
        const std::vector<Connect4> positions = random_positions(rows, cols, 37, 11);  // 3 chunks, the last padded
        const size_t n = positions.size(), A = static_cast<size_t>(cols);
        std::vector<float> priors(n * A), values(n);
        m.net.evaluate(positions, priors, values);
        std::vector<float> again(n * A), values_again(n);
        m.net.evaluate(positions, again, values_again);
        EXPECT_EQ(again, priors);  // the same batch: the same bits
        EXPECT_EQ(values_again, values);
        std::vector<float> one_prior(A), one_value(1);
        for (size_t i = 0; i < n; ++i) {
            m.net.evaluate(std::span<const Connect4>(&positions[i], 1), one_prior, one_value);
            for (size_t a = 0; a < A; ++a) worst = std::max(worst, std::abs(one_prior[a] - priors[i * A + a]));
            worst = std::max(worst, std::abs(one_value[0] - values[i]));
            // a distribution over the legal moves, a value inside (-1, 1)
            float sum = 0;
            for (size_t a = 0; a < A; ++a) {
                EXPECT_EQ(priors[i * A + a] > 0.0f, (positions[i].legal_moves() >> a & 1) == 1);
                sum += priors[i * A + a];
            }
            EXPECT_NEAR(sum, 1.0f, 1e-5f);
            EXPECT_LT(std::abs(values[i]), 1.0f);
        }
    }
    EXPECT_LE(worst, 1e-6f);
    std::printf("batched vs one at a time: largest difference %.3g\n", static_cast<double>(worst));
}

TEST(PolicyValueNet, LearnsAFixedBatch) {
    OneRankNet m(tiny(), 8);
    const std::vector<Connect4> states = random_positions(5, 6, 8, 5);
    std::vector<float> policies(8 * 6, 0.0f), outcomes(8);
    for (size_t i = 0; i < 8; ++i) {
        const uint64_t legal = states[i].legal_moves();
        policies[i * 6 + static_cast<size_t>(std::countr_zero(legal))] = 1.0f;  // the leftmost legal move
        outcomes[i] = i % 2 == 0 ? 1.0f : -1.0f;
    }
    const float first = m.net.train_step(states, policies, outcomes).loss;
    float last = first;
    for (int step = 0; step < 150; ++step) {
        last = m.net.train_step(states, policies, outcomes).loss;
        for (int64_t k = 0; k < m.net.flat_size(); ++k) m.net.params()[k] -= 0.05f * m.net.grads()[k];  // plain SGD
    }
    EXPECT_LT(last, 0.1f * first) << "first " << first << " last " << last;
}

TEST(PolicyValueNet, RefusesABoardLargerThanItEmbeds) {
    OneRankNet m({.layers = 1, .hidden = 16, .heads = 2, .ffn = 32, .board_rows = 5, .board_cols = 6});
    m.net.check_board(5, 6);
    m.net.check_board(4, 4);
    try {
        m.net.check_board(6, 7);
        FAIL() << "a 6 x 7 board on a 5 x 6 network was accepted";
    } catch (const UserError& e) {
        EXPECT_NE(std::string(e.what()).find("6 x 7 board is larger than the network embeds (5 x 6"), std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace ms
