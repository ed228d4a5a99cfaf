// test_mcts.cpp: engine/selfplay/mcts -- the batched tree search: immediate wins, blocks and forced wins a few plies
// deep (checked against alpha-beta's solves), visit counts and terminal leaves, the first simulation's choice, the
// Dirichlet noise (a pure function of seed, game and move, absent without noise, the right moments), the search of
// one game inside a batch equal to its search alone bit for bit, the evaluator's batches and the counters, and the
// option refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/check.h"
#include "engine/games/alpha_beta.h"
#include "engine/games/connect4.h"
#include "engine/selfplay/mcts.h"
#include "engine/selfplay/self_play.h"
#include "tests/common/selfplay_evaluators.h"

namespace {

using ms::games::AlphaBeta;
using ms::games::Connect4;
using ms::games::kWinScore;
using ms::games::Outcome;
using ms::games::TieBreak;
using ms::selfplay::BatchedSearch;
using ms::selfplay::Evaluator;
using ms::selfplay::MctsOptions;
using ms::selfplay::most_visited;
using ms::selfplay::RootResult;
using ms::selfplay::RootSelection;
using ms::selfplay::SearchRoot;
using ms::test::RolloutEvaluator;
using ms::test::SolverEvaluator;
using ms::test::UniformEvaluator;

// The options of an evaluation search: no noise.
MctsOptions quiet(int simulations) {
    MctsOptions options;
    options.simulations = simulations;
    options.noise_fraction = 0.0f;
    return options;
}

RootResult search_alone(Evaluator<Connect4>& evaluator, const MctsOptions& options, uint64_t seed,
                        const Connect4& state, uint64_t game = 0) {
    return ms::selfplay::search(evaluator, options, seed, SearchRoot<Connect4>{state, game});
}

int sum(const std::vector<int>& v) {
    int s = 0;
    for (const int x : v) s += x;
    return s;
}

// Positions of the game after `count` random moves from the empty board, that are not over.
std::vector<Connect4> random_positions(int rows, int cols, int count, uint64_t seed) {
    std::vector<Connect4> positions;
    for (uint64_t s = seed; static_cast<int>(positions.size()) < count; ++s) {
        Connect4 state = Connect4::empty(rows, cols);
        const int moves = static_cast<int>(s % 12);
        for (int m = 0; m < moves && state.outcome() == Outcome::kOngoing; ++m) {
            state.play(ms::games::random_move(state, s));
        }
        if (state.outcome() == Outcome::kOngoing) positions.push_back(state);
    }
    return positions;
}

void expect_same(const RootResult& a, const RootResult& b) {
    EXPECT_EQ(a.visits, b.visits);
    EXPECT_EQ(a.q, b.q);  // bit for bit
    EXPECT_EQ(a.priors, b.priors);
    EXPECT_EQ(a.proven, b.proven);
    EXPECT_EQ(a.policy, b.policy);
    EXPECT_EQ(a.value, b.value);
    EXPECT_EQ(a.network_value, b.network_value);
    EXPECT_EQ(a.chosen, b.chosen);
}

// The options of a self-play search with Gumbel root selection.
MctsOptions gumbel(int simulations, int leaves_per_wave) {
    MctsOptions options = quiet(simulations);
    options.root = RootSelection::kGumbel;
    options.leaves_per_wave = leaves_per_wave;
    return options;
}

// softmax(log P + sigma) of a result, sigma from its own visits, Q and network value: what its policy must be.
std::vector<double> gumbel_policy_of(const RootResult& r) {
    std::vector<float> priors;
    std::vector<int32_t> visits;
    std::vector<double> q;
    std::vector<int> actions;
    for (size_t a = 0; a < r.priors.size(); ++a) {
        if (r.priors[a] == 0.0f && r.visits[a] == 0) continue;  // illegal
        priors.push_back(r.priors[a]);
        visits.push_back(r.visits[a]);
        q.push_back(r.q[a]);
        actions.push_back(static_cast<int>(a));
    }
    std::vector<double> sigma(priors.size());
    ms::selfplay::completed_q_sigma(priors, visits, q, r.network_value, sigma);
    double sum = 0.0;
    for (size_t i = 0; i < sigma.size(); ++i) sum += sigma[i] = std::exp(std::log(priors[i]) + sigma[i]);
    std::vector<double> policy(r.priors.size(), 0.0);
    for (size_t i = 0; i < sigma.size(); ++i) policy[static_cast<size_t>(actions[i])] = sigma[i] / sum;
    return policy;
}

// The UserError text of f(), or "" when it does not throw one.
template <typename F>
std::string user_error(F f) {
    try {
        f();
    } catch (const ms::UserError& e) {
        return e.what();
    }
    return "";
}

TEST(Mcts, TakesAnImmediateWin) {
    // X completes the bottom row with column 4; alpha-beta agrees it is the only win that soon.
    for (const auto [rows, cols] : {std::array<int, 2>{6, 7}, {4, 5}}) {
        SCOPED_TRACE(testing::Message() << rows << " x " << cols);
        const Connect4 state = Connect4::from_moves(rows, cols, "112233");
        AlphaBeta solver(16);
        ASSERT_EQ(solver.search(state, {1, TieBreak::kCentre, 0}).best_moves, 0b1000u);
        UniformEvaluator evaluator;
        const RootResult r = search_alone(evaluator, quiet(64), 0, state);
        EXPECT_EQ(most_visited(r), 3);
        EXPECT_EQ(r.q[3], 1.0f);  // every simulation through it ends at the win
        // The winning move is proven from the start, so every simulation takes it.
        EXPECT_EQ(r.proven[3], 1);
        EXPECT_EQ(r.visits[3], 64);
        EXPECT_GT(r.value, 0.5f);
    }
}

TEST(Mcts, BlocksAnImmediateThreat) {
    // O holds columns 1..3 of the bottom row; X must take column 4: alpha-beta proves that every other move loses.
    const Connect4 state = Connect4::from_moves(6, 7, "717263");
    AlphaBeta solver(16);
    ASSERT_EQ(solver.search(state, {2, TieBreak::kCentre, 0}).best_moves, 0b0001000u);
    UniformEvaluator evaluator;
    const RootResult r = search_alone(evaluator, quiet(200), 0, state);
    EXPECT_EQ(most_visited(r), 3);
    for (int a = 0; a < 7; ++a) {
        if (a != 3) {
            EXPECT_LT(r.q[a], 0.0f) << a;
            EXPECT_EQ(r.proven[a], -1) << a;  // O completes the row in reply: proven at its first visit
            EXPECT_EQ(r.visits[a], 1) << a;
        }
    }
    EXPECT_EQ(r.proven[3], 0);
}

TEST(Mcts, ProofsAgreeWithTheSolver) {
    // Every action a search proves won or lost, on random 4 x 5 positions, is so by alpha-beta's full solve; the
    // searches prove some of each.
    AlphaBeta solver(18);
    int won = 0, lost = 0;
    for (const Connect4& state : random_positions(4, 5, 200, 3)) {
        RolloutEvaluator evaluator;
        const RootResult r = search_alone(evaluator, quiet(300), 0, state);
        for (int a = 0; a < state.num_actions(); ++a) {
            if (r.proven[a] == 0) continue;
            Connect4 after = state;
            after.play(a);
            const bool wins =
                after.last_mover_won() || (after.outcome() == Outcome::kOngoing &&
                                           solver.search(after, {0, TieBreak::kCentre, 0}).score < -kWinScore);
            const bool loses = after.outcome() == Outcome::kOngoing &&
                               solver.search(after, {0, TieBreak::kCentre, 0}).score > kWinScore;
            EXPECT_TRUE(r.proven[a] > 0 ? wins : loses) << state.to_string() << "action " << a;
            (r.proven[a] > 0 ? won : lost)++;
        }
        // A proven win is the move, and a move is never one proven lost while another is not.
        const int move = most_visited(r);
        bool any_won = false, any_open = false;
        for (int a = 0; a < state.num_actions(); ++a) {
            any_won |= r.proven[a] > 0;
            any_open |= state.is_legal(a) && r.proven[a] == 0;
        }
        if (any_won) {
            EXPECT_EQ(r.proven[move], 1);
        } else if (any_open) {
            EXPECT_EQ(r.proven[move], 0);
        }
    }
    EXPECT_GE(won, 10);
    EXPECT_GE(lost, 10);
}

TEST(Mcts, FindsForcedWinsAFewPliesDeep) {
    // Positions the side to move wins in `plies` plies with best play (the first on the standard board: an open
    // three on the bottom row; the others drawn from random 4 x 5 games, where the solve is fast). The search's
    // move must keep the forced win, which the solver checks; with the uniform evaluator the search alone finds
    // it, with the solver's values it only has to follow them.
    struct Case {
        int rows, cols;
        const char* moves;
        int plies;
        uint64_t winning;  // bit a: action a keeps the forced win
    };
    const std::array<Case, 9> cases = {{{6, 7, "4455", 3, 0b0100100},
                                        {4, 5, "2233", 3, 0b01000},
                                        {4, 5, "12233254", 3, 0b01000},
                                        {4, 5, "14233345", 3, 0b00010},
                                        {4, 5, "41133115", 5, 0b11110},
                                        {4, 5, "14422324", 7, 0b10000},
                                        {4, 5, "2344534", 7, 0b00110},
                                        {4, 5, "25313424", 9, 0b00110},
                                        {4, 5, "31251524", 9, 0b00110}}};
    AlphaBeta solver(18);
    for (const Case& c : cases) {
        SCOPED_TRACE(c.moves);
        const Connect4 state = Connect4::from_moves(c.rows, c.cols, c.moves);
        // The solver's account: the side to move wins with its k-th stone, p = its stones left after that + 1.
        const int depth = c.rows * c.cols <= 20 ? 0 : c.plies;
        const ms::games::SearchResult solved = solver.search(state, {depth, TieBreak::kCentre, 0});
        ASSERT_GT(solved.score, kWinScore);
        const int k = c.rows * c.cols / 2 + 1 - ms::games::solver_score(solved.score);
        EXPECT_EQ(2 * (k - state.move_count() / 2) - 1, c.plies);
        uint64_t winning = 0;
        for (int a = 0; a < c.cols; ++a) {
            if (!state.is_legal(a)) continue;
            Connect4 after = state;
            after.play(a);
            const bool wins =
                after.last_mover_won() || solver.search(after, {depth - 1, TieBreak::kCentre, 0}).score < -kWinScore;
            winning |= uint64_t{wins} << a;
        }
        EXPECT_EQ(winning, c.winning);

        UniformEvaluator uniform;
        const int uniform_move = most_visited(search_alone(uniform, quiet(800), 0, state));
        EXPECT_TRUE(c.winning >> uniform_move & 1) << uniform_move;
        if (c.rows * c.cols <= 20) {
            SolverEvaluator exact;
            const int exact_move = most_visited(search_alone(exact, quiet(100), 0, state));
            EXPECT_TRUE(c.winning >> exact_move & 1) << exact_move;
        }
    }
}

TEST(Mcts, VisitCountsSumToTheSimulations) {
    const std::vector<Connect4> positions = random_positions(5, 6, 6, 11);
    for (const int simulations : {1, 7, 50}) {
        for (const int leaves : {1, 4, 16}) {
            for (const float noise : {0.0f, 0.25f}) {
                MctsOptions options = quiet(simulations);
                options.leaves_per_wave = leaves;
                options.noise_fraction = noise;
                for (const Connect4& state : positions) {
                    RolloutEvaluator evaluator;
                    const RootResult r = search_alone(evaluator, options, 3, state);
                    EXPECT_EQ(sum(r.visits), simulations);
                    float prior_sum = 0.0f;
                    for (int a = 0; a < state.num_actions(); ++a) {
                        if (!state.is_legal(a)) {
                            EXPECT_EQ(r.visits[a], 0);
                            EXPECT_EQ(r.priors[a], 0.0f);
                        }
                        EXPECT_LE(std::abs(r.q[a]), 1.0f);
                        prior_sum += r.priors[a];
                    }
                    EXPECT_NEAR(prior_sum, 1.0f, 1e-5f);  // float rounding of 6 terms
                }
            }
        }
    }
}

TEST(Mcts, FirstSimulationTakesTheHighestPrior) {
    // Before any child is visited every Q is the first-play urgency, so U, which grows with the prior, decides.
    for (const Connect4& state : random_positions(6, 7, 8, 5)) {
        RolloutEvaluator evaluator;
        const RootResult r = search_alone(evaluator, quiet(1), 0, state);
        int highest = -1;
        for (int a = 0; a < state.num_actions(); ++a) {
            if (state.is_legal(a) && (highest < 0 || r.priors[a] > r.priors[highest])) highest = a;
        }
        std::vector<int> expected(state.num_actions(), 0);
        expected[highest] = 1;
        EXPECT_EQ(r.visits, expected);
    }
}

TEST(Mcts, TerminalLeavesTakeTheirExactValueWithoutTheNetwork) {
    // One move is left on this 4 x 5 board, and it fills the board without a line: every simulation ends at that
    // draw, and only the root goes to the evaluator.
    const Connect4 state = Connect4::from_moves(4, 5, "2111132242533434554");
    ASSERT_EQ(state.legal_moves(), 0b00001u << 4);
    UniformEvaluator evaluator;
    BatchedSearch<Connect4> search(quiet(30), 0);
    const std::array<SearchRoot<Connect4>, 1> roots = {{{state, 0}}};
    const RootResult r = search.run(evaluator, roots).front();
    EXPECT_EQ(r.visits, (std::vector<int>{0, 0, 0, 0, 30}));
    EXPECT_EQ(r.q[4], 0.0f);
    EXPECT_EQ(evaluator.rows(), 1);
    EXPECT_EQ(search.counters().positions_evaluated, 1);
    EXPECT_EQ(search.counters().simulations, 30);
    // A win ends the game too: X's only sensible move wins, and the search proves it from the terminal leaf.
    const RootResult win = search_alone(evaluator, quiet(30), 0, Connect4::from_moves(4, 5, "112233"));
    EXPECT_EQ(win.q[3], 1.0f);
}

TEST(Mcts, DirichletNoiseIsAPureFunctionOfSeedGameAndMove) {
    const auto noise = [](float alpha, uint64_t seed, uint64_t game, int move) {
        std::vector<double> out(7);
        ms::selfplay::dirichlet_noise(alpha, seed, game, move, out);
        return out;
    };
    for (const float alpha : {0.03f, 0.3f, 1.0f, 2.5f}) {
        const std::vector<double> base = noise(alpha, 1, 2, 3);
        double total = 0.0;
        for (const double x : base) {
            EXPECT_GE(x, 0.0);
            total += x;
        }
        EXPECT_NEAR(total, 1.0, 1e-12);  // double rounding of 7 terms
        EXPECT_EQ(noise(alpha, 1, 2, 3), base);
        EXPECT_NE(noise(alpha, 9, 2, 3), base);
        EXPECT_NE(noise(alpha, 1, 9, 3), base);
        EXPECT_NE(noise(alpha, 1, 2, 9), base);
    }
}

TEST(Mcts, DirichletNoiseHasTheRightMoments) {
    // Each entry of Dirichlet(alpha) over n is Beta(alpha, (n - 1) alpha): mean 1/n, variance
    // (1/n)(1 - 1/n) / (n alpha + 1).
    constexpr int kN = 7, kDraws = 20000;
    for (const float alpha : {0.3f, 1.0f, 2.5f}) {
        SCOPED_TRACE(alpha);
        double mean = 0.0, square = 0.0;
        std::vector<double> out(kN);
        for (int d = 0; d < kDraws; ++d) {
            ms::selfplay::dirichlet_noise(alpha, 7, static_cast<uint64_t>(d), 0, out);
            mean += out[0];
            square += out[0] * out[0];
        }
        mean /= kDraws;
        const double variance = square / kDraws - mean * mean;
        const double expected_mean = 1.0 / kN;
        const double expected_variance = expected_mean * (1.0 - expected_mean) / (kN * alpha + 1.0);
        // 5 standard errors of the mean of kDraws draws.
        EXPECT_NEAR(mean, expected_mean, 5.0 * std::sqrt(expected_variance / kDraws));
        // Measured: each sample variance within 1% of the formula. 10% leaves room for other draws, not for a wrong
        // sampler: without the alpha < 1 boost, alpha 0.3 would draw Dirichlet(1.3), of a third of the variance.
        EXPECT_NEAR(variance / expected_variance, 1.0, 0.1);
    }
}

TEST(Mcts, NoiseMixesTheRootPriorsPerSeedAndGame) {
    const Connect4 state = Connect4::from_moves(6, 7, "44");
    UniformEvaluator evaluator;
    // No noise: the network's priors, exactly.
    const RootResult plain = search_alone(evaluator, quiet(20), 5, state);
    EXPECT_EQ(plain.priors, std::vector<float>(7, 1.0f / 7.0f));
    EXPECT_EQ(search_alone(evaluator, quiet(20), 6, state, 9).priors, plain.priors);

    MctsOptions options = quiet(20);
    options.noise_fraction = 0.25f;
    options.dirichlet_alpha = 0.5f;
    const RootResult noisy = search_alone(evaluator, options, 5, state, 3);
    std::vector<double> eta(7);
    ms::selfplay::dirichlet_noise(0.5f, 5, 3, state.move_count(), eta);
    for (int a = 0; a < 7; ++a) {
        EXPECT_EQ(noisy.priors[a], static_cast<float>(0.75 * (1.0f / 7.0f) + 0.25 * eta[a])) << a;
    }
    expect_same(search_alone(evaluator, options, 5, state, 3), noisy);
    EXPECT_NE(search_alone(evaluator, options, 6, state, 3).priors, noisy.priors);
    EXPECT_NE(search_alone(evaluator, options, 5, state, 4).priors, noisy.priors);
}

TEST(Mcts, SequentialHalvingSchedule) {
    using ms::selfplay::considered_visits;
    // One action: every simulation goes to it.
    EXPECT_EQ(considered_visits(1, 5), (std::vector<int32_t>{0, 1, 2, 3, 4}));
    // Two actions, ceil(log2 2) = 1: rounds of 6 / (1 * 2) = 3.
    EXPECT_EQ(considered_visits(2, 6), (std::vector<int32_t>{0, 0, 1, 1, 2, 2}));
    // Four: 16 / (2 * 4) = 2 rounds over 4, then 16 / (2 * 2) = 4 over 2.
    EXPECT_EQ(considered_visits(4, 16), (std::vector<int32_t>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5}));
    // Connect Four's 7 at self-play's 48: 2 rounds over 7 (14), 5 over 3 (15), 8 over 2 (16), then 3 of the next.
    std::vector<int32_t> expected;
    for (int v = 0; v < 2; ++v) expected.insert(expected.end(), 7, v);
    for (int v = 2; v < 7; ++v) expected.insert(expected.end(), 3, v);
    for (int v = 7; v < 15; ++v) expected.insert(expected.end(), 2, v);
    expected.insert(expected.end(), {15, 15, 16});
    EXPECT_EQ(considered_visits(7, 48), expected);
    // Fewer simulations than actions: one round, cut short.
    EXPECT_EQ(considered_visits(7, 3), (std::vector<int32_t>{0, 0, 0}));
}

TEST(Mcts, CompletedQSigmaByHand) {
    // P = (1/2, 1/4, 1/4), N = (2, 1, 0), Q = (1/2, -1/2, -), v = 0.2:
    // v_mix = (0.2 + 3 * (1/2 * 1/2 + 1/4 * -1/2) / (3/4)) / 4 = 0.175; completed (0.5, -0.5, 0.175), rescaled to
    // (1, 0, 0.675), times (50 + 2) * 0.1 = 5.2.
    const std::vector<float> priors = {0.5f, 0.25f, 0.25f};
    const std::vector<int32_t> visits = {2, 1, 0};
    const std::vector<double> q = {0.5, -0.5, 0.0};
    std::vector<double> sigma(3);
    ms::selfplay::completed_q_sigma(priors, visits, q, 0.2, sigma);
    EXPECT_NEAR(sigma[0], 5.2, 1e-12);
    EXPECT_NEAR(sigma[1], 0.0, 1e-12);
    EXPECT_NEAR(sigma[2], 0.675 * 5.2, 1e-12);
    // Nothing visited: every completed Q is v, and equal ones rescale to 0.
    ms::selfplay::completed_q_sigma(priors, std::vector<int32_t>{0, 0, 0}, q, 0.7, sigma);
    EXPECT_EQ(sigma, (std::vector<double>{0.0, 0.0, 0.0}));
}

TEST(Mcts, GumbelNoiseIsAPureFunctionOfSeedGameAndMove) {
    std::vector<double> a(7), b(7), c(7), d(7);
    ms::selfplay::gumbel_noise(1, 2, 3, a);
    ms::selfplay::gumbel_noise(1, 2, 3, b);
    ms::selfplay::gumbel_noise(1, 2, 4, c);
    ms::selfplay::gumbel_noise(1, 5, 3, d);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
    EXPECT_NE(a, d);
    // Gumbel(0, 1): mean Euler's gamma, variance pi^2 / 6.
    std::vector<double> many(4096);
    double mean = 0.0, square = 0.0;
    for (uint64_t game = 0; game < 16; ++game) {
        ms::selfplay::gumbel_noise(9, game, 0, many);
        for (const double g : many) {
            mean += g;
            square += g * g;
        }
    }
    const double n = 16.0 * 4096.0;
    mean /= n;
    const double variance = square / n - mean * mean;
    // Standard errors: sqrt(1.645 / n) = 0.005 for the mean, about 0.02 for the variance.
    EXPECT_NEAR(mean, 0.5772, 0.025);
    EXPECT_NEAR(variance, 1.6449, 0.1);
}

TEST(Mcts, GumbelSearchHalvesTheActionsAndLearnsTheCompletedPolicy) {
    // One leaf per wave: the visits follow the schedule exactly, so on a board with 7 moves and no proofs within
    // reach they are 2 each, 7 for the best 3, 15 for the best 2 and 16 and 17 for the last two (the schedule
    // above). The move is the one of 17; the policy is softmax(log P + sigma) of the result's own numbers.
    // Positions of at most 4 stones: no child of the root can be proven within the search (a proof there needs a
    // side with 3 stones).
    for (const char* moves : {"", "4", "44", "34", "4453"}) {
        SCOPED_TRACE(moves);
        const Connect4 state = Connect4::from_moves(6, 7, moves);
        RolloutEvaluator evaluator;
        const RootResult r = search_alone(evaluator, gumbel(48, 1), 4, state, 9);
        std::vector<int> sorted = r.visits;
        std::sort(sorted.begin(), sorted.end());
        EXPECT_EQ(sorted, (std::vector<int>{2, 2, 2, 2, 7, 16, 17}));
        ASSERT_GE(r.chosen, 0);
        EXPECT_EQ(r.visits[static_cast<size_t>(r.chosen)], 17);
        const std::vector<double> expected = gumbel_policy_of(r);
        double total = 0.0;
        for (size_t a = 0; a < expected.size(); ++a) {
            EXPECT_NEAR(r.policy[a], expected[a], 1e-6) << a;  // Q rounded to float in the result
            total += r.policy[a];
        }
        EXPECT_NEAR(total, 1.0, 1e-6);
    }
    // Uniform priors and values of 0 make every sigma 0: each halving keeps the actions of the highest g, and the
    // move is the argmax of the game's g.
    std::vector<int> chosen;
    for (uint64_t game = 0; game < 8; ++game) {
        UniformEvaluator evaluator;
        chosen.push_back(search_alone(evaluator, gumbel(48, 1), 4, Connect4::empty(6, 7), game).chosen);
        std::vector<double> g(7);
        ms::selfplay::gumbel_noise(4, game, 0, g);
        EXPECT_EQ(chosen.back(), std::max_element(g.begin(), g.end()) - g.begin()) << game;
    }
    EXPECT_LT(std::count(chosen.begin(), chosen.end(), chosen.front()), 8);
    // Several leaves per wave: the visits still sum to the simulations, whatever the collisions did.
    for (const Connect4& state : random_positions(5, 6, 6, 71)) {
        RolloutEvaluator evaluator;
        const RootResult r = search_alone(evaluator, gumbel(40, 8), 4, state, 2);
        EXPECT_EQ(sum(r.visits), 40);
        ASSERT_GE(r.chosen, 0);
        EXPECT_TRUE(state.is_legal(r.chosen));
    }
}

TEST(Mcts, GumbelSearchTakesTheWinAndBlocksTheThreat) {
    UniformEvaluator evaluator;
    const RootResult win = search_alone(evaluator, gumbel(48, 4), 0, Connect4::from_moves(6, 7, "112233"));
    EXPECT_EQ(win.chosen, 3);
    EXPECT_EQ(win.proven[3], 1);
    const RootResult block = search_alone(evaluator, gumbel(48, 4), 0, Connect4::from_moves(6, 7, "717263"));
    EXPECT_EQ(block.chosen, 3);
    for (int a = 0; a < 7; ++a) {
        if (a != 3) {
            EXPECT_EQ(block.proven[a], -1) << a;
        }
    }
    // Forced wins a few plies deep (4 x 5, from FindsForcedWinsAFewPliesDeep): the move keeps the win.
    const std::array<std::pair<const char*, uint64_t>, 3> deep = {
        {{"2233", 0b01000}, {"41133115", 0b11110}, {"14422324", 0b10000}}};
    for (const auto& [moves, winning] : deep) {
        SCOPED_TRACE(moves);
        const RootResult r = search_alone(evaluator, gumbel(800, 4), 0, Connect4::from_moves(4, 5, moves));
        EXPECT_TRUE(winning >> r.chosen & 1) << r.chosen;
    }
}

TEST(Mcts, OneGameInABatchEqualsItsSearchAlone) {
    // Trees are independent and the evaluator row-independent, so neither the other games of the batch nor how
    // the leaves are cut into evaluate() calls may change a search.
    std::vector<SearchRoot<Connect4>> roots;
    uint64_t game = 100;
    for (const Connect4& state : random_positions(6, 7, 10, 21)) roots.push_back({state, game++});
    // The same game twice; the same position in another game (other noise); a position that wins at once
    // (terminal leaves).
    roots.push_back(roots[3]);
    roots.push_back({roots[3].state, 555});
    roots.push_back({Connect4::from_moves(6, 7, "112233"), game++});
    for (const int leaves : {1, 3, 8, 32}) {
        for (const int max_batch : {1, 5, 64}) {
            for (const RootSelection root : {RootSelection::kPuct, RootSelection::kGumbel}) {
                SCOPED_TRACE(testing::Message() << "leaves_per_wave " << leaves << ", max_batch " << max_batch
                                                << (root == RootSelection::kGumbel ? ", Gumbel" : ", PUCT"));
                MctsOptions options;
                options.simulations = 60;
                options.leaves_per_wave = leaves;
                options.root = root;
                if (root == RootSelection::kGumbel) options.noise_fraction = 0.0f;
                RolloutEvaluator batched_evaluator(max_batch);
                BatchedSearch<Connect4> batched(options, 17);
                const std::vector<RootResult> together = batched.run(batched_evaluator, roots);
                ASSERT_EQ(together.size(), roots.size());
                for (size_t i = 0; i < roots.size(); ++i) {
                    RolloutEvaluator alone_evaluator(64);
                    expect_same(together[i], search_alone(alone_evaluator, options, 17, roots[i].state, roots[i].game));
                }
                expect_same(together[3], together[10]);
                // Another game draws other noise: Dirichlet's mixes into the priors, Gumbel's leaves them alone.
                if (root == RootSelection::kPuct) {
                    EXPECT_NE(together[3].priors, together[11].priors);
                } else {
                    EXPECT_EQ(together[3].priors, together[11].priors);
                }
            }
        }
    }
}

TEST(Mcts, BatchesTheLeavesOfAllTreesAndCountsThem) {
    std::vector<SearchRoot<Connect4>> roots;
    for (const Connect4& state : random_positions(6, 7, 16, 40)) roots.push_back({state, roots.size()});
    MctsOptions options = quiet(40);
    options.leaves_per_wave = 8;
    RolloutEvaluator evaluator(50);
    BatchedSearch<Connect4> search(options, 0);
    search.run(evaluator, roots);
    const ms::selfplay::SearchCounters& c = search.counters();
    EXPECT_EQ(c.searches, 16);
    EXPECT_EQ(c.simulations, 16 * 40);
    EXPECT_EQ(c.positions_evaluated, evaluator.rows());
    EXPECT_EQ(c.evaluate_calls, evaluator.calls());
    EXPECT_EQ(evaluator.largest_batch(), 50);  // 16 trees x up to 8 leaves: more than one call per wave
    // Every simulation evaluates a new leaf or reaches a finished game; each root adds one row of its own.
    EXPECT_LE(c.positions_evaluated, c.simulations + c.searches);
    // Waves of at most 8 simulations per tree: at least 40 / 8 of them.
    EXPECT_GE(c.waves, 5);

    // One leaf at a time: a call per row, a wave per simulation, no collisions.
    options.leaves_per_wave = 1;
    RolloutEvaluator single(1);
    BatchedSearch<Connect4> one(options, 0);
    one.run(single, std::span<const SearchRoot<Connect4>>(roots.data(), 1));
    EXPECT_EQ(one.counters().evaluate_calls, one.counters().positions_evaluated);
    EXPECT_EQ(one.counters().waves, 40);
    EXPECT_EQ(one.counters().collisions, 0);
}

TEST(Mcts, ReusesTheSubtreeUnderTheNewRoot) {
    // One ply on (self-play: the chosen move) and two plies on (a match: the agent's move and the reply). With one
    // leaf per wave and no noise, a subtree grows exactly as a search rooted at its top would (the same selections
    // in the same order), so a search that reuses it equals a fresh search of the new root, bit for bit, while
    // evaluating only the simulations the subtree did not hold.
    std::vector<SearchRoot<Connect4>> roots;
    for (const Connect4& state : random_positions(6, 7, 8, 60)) roots.push_back({state, 10 + roots.size()});
    MctsOptions options = quiet(200);
    options.leaves_per_wave = 1;
    options.reuse_tree = true;
    RolloutEvaluator evaluator(64);
    BatchedSearch<Connect4> search(options, 3);
    const std::vector<RootResult> first = search.run(evaluator, roots);
    EXPECT_EQ(search.counters().reused, 0);

    std::vector<SearchRoot<Connect4>> next;
    int64_t kept = 0;  // what the one-ply roots carry: their visits less their own evaluation
    int two_ply = 0;
    for (size_t i = 0; i < roots.size(); ++i) {
        Connect4 state = roots[i].state;
        const int move = most_visited(first[i]);
        if (first[i].proven[move] != 0) continue;  // a proven node stops the selections through it
        state.play(move);
        if (i % 2 == 0) {
            kept += first[i].visits[move] - 1;
        } else {
            // A reply: 200 simulations on 6 x 7 visit every reply to the most visited move.
            state.play(ms::games::random_move(state, i));
            if (state.outcome() != Outcome::kOngoing) continue;
            ++two_ply;
        }
        next.push_back({state, roots[i].game});
    }
    ASSERT_GE(next.size(), 6u);
    ASSERT_GT(two_ply, 0);
    const int64_t evaluated = search.counters().positions_evaluated;
    const std::vector<RootResult> second = search.run(evaluator, next);
    const ms::selfplay::SearchCounters& c = search.counters();
    for (size_t i = 0; i < next.size(); ++i) {
        SCOPED_TRACE(next[i].state.to_string());
        EXPECT_EQ(sum(second[i].visits), 200);
        RolloutEvaluator fresh_evaluator(64);
        expect_same(second[i], search_alone(fresh_evaluator, options, 3, next[i].state, next[i].game));
    }
    EXPECT_GE(c.reused, kept + two_ply);  // every two-ply root was expanded, so kept at one visit or more
    EXPECT_EQ(c.simulations, static_cast<int64_t>(roots.size() + next.size()) * 200 - c.reused);
    // No root was evaluated again: only new leaves (a finished game is not one) went to the evaluator.
    EXPECT_LE(c.positions_evaluated - evaluated, static_cast<int64_t>(next.size()) * 200 - c.reused);

    // Without reuse_tree, the same roots build fresh trees.
    options.reuse_tree = false;
    BatchedSearch<Connect4> fresh(options, 3);
    fresh.run(evaluator, roots);
    fresh.run(evaluator, next);
    EXPECT_EQ(fresh.counters().reused, 0);
    EXPECT_EQ(fresh.counters().simulations, static_cast<int64_t>(roots.size() + next.size()) * 200);
}

// A root's own simulation count and noise (playout-cap randomisation's fast searches): its visits sum to its count;
// without noise its search is the one of options without noise; and a small search after a larger one on the same
// game, which reuses more visits than it would run, still runs one simulation.
TEST(Mcts, EachRootRunsItsOwnSimulationsWithOrWithoutNoise) {
    const std::vector<Connect4> states = random_positions(6, 7, 6, 61);
    MctsOptions noisy = quiet(64);
    noisy.noise_fraction = 0.25f;
    noisy.reuse_tree = true;
    std::vector<SearchRoot<Connect4>> roots;
    for (size_t i = 0; i < states.size(); ++i)
        roots.push_back({.state = states[i], .game = 20 + i, .simulations = i % 2 ? 12 : 0, .noise = i % 2 == 0});
    RolloutEvaluator evaluator(16);
    BatchedSearch<Connect4> search(noisy, 5);
    const std::vector<RootResult> results = search.run(evaluator, roots);
    for (size_t i = 0; i < roots.size(); ++i) {
        SCOPED_TRACE(i);
        EXPECT_EQ(sum(results[i].visits), i % 2 ? 12 : 64);
        RolloutEvaluator alone(16);
        MctsOptions own = noisy;
        own.simulations = i % 2 ? 12 : 64;
        own.noise_fraction = i % 2 ? 0.0f : 0.25f;
        expect_same(results[i], search_alone(alone, own, 5, states[i], roots[i].game));
    }
    EXPECT_EQ(search.counters().simulations, 3 * 64 + 3 * 12);
    // the full searches' games, one ply on, as fast searches of 2 simulations: they keep more visits than that
    std::vector<SearchRoot<Connect4>> next;
    for (size_t i = 0; i < roots.size(); i += 2) {
        Connect4 state = states[i];
        const int move = most_visited(results[i]);
        if (results[i].proven[move] != 0 || results[i].visits[move] < 3) continue;
        state.play(move);
        next.push_back({.state = state, .game = roots[i].game, .simulations = 2, .noise = false});
    }
    ASSERT_FALSE(next.empty());
    const int64_t before = search.counters().simulations;
    const std::vector<RootResult> small = search.run(evaluator, next);
    for (const RootResult& r : small) EXPECT_GT(sum(r.visits), 2);
    EXPECT_EQ(search.counters().simulations - before, static_cast<int64_t>(next.size()));
}

TEST(Mcts, OptionsOutOfRangeAreRefusedWithASentence) {
    const auto refusal = [](auto change) {
        MctsOptions options;
        change(options);
        return user_error([&] { ms::selfplay::check_mcts_options(options); });
    };
    EXPECT_EQ(refusal([](MctsOptions&) {}), "");
    EXPECT_EQ(refusal([](MctsOptions& o) { o.simulations = 0; }),
              "config error: selfplay.simulations = 0 must be in [1, 1048576]");
    EXPECT_EQ(refusal([](MctsOptions& o) { o.leaves_per_wave = 0; }),
              "config error: selfplay.leaves_per_wave = 0 must be in [1, 4096]");
    EXPECT_EQ(refusal([](MctsOptions& o) { o.c_puct = 0.0f; }),
              "config error: selfplay.c_puct = 0 must be in (0, 100]");
    EXPECT_EQ(refusal([](MctsOptions& o) { o.noise_fraction = 1.5f; }),
              "config error: selfplay.noise_fraction = 1.5 must be in [0, 1]");
    EXPECT_EQ(refusal([](MctsOptions& o) { o.dirichlet_alpha = 0.0f; }),
              "config error: selfplay.dirichlet_alpha = 0 must be in (0, 100]");
    EXPECT_EQ(refusal([](MctsOptions& o) { o.virtual_loss = -1.0f; }),
              "config error: selfplay.virtual_loss = -1 must be in [0, 100]");
    EXPECT_EQ(refusal([](MctsOptions& o) { o.fpu_reduction = NAN; }),
              "config error: selfplay.fpu_reduction = nan must be in [0, 100]");
    EXPECT_EQ(refusal([](MctsOptions& o) { o.root = RootSelection::kGumbel; }),
              "config error: selfplay.noise_fraction = 0.25 must be 0 with selfplay.search: gumbel (its root noise "
              "is Gumbel's)");
    UniformEvaluator evaluator;
    EXPECT_NE(user_error([&] { BatchedSearch<Connect4>(quiet(0), 0); }), "");
}

}  // namespace
