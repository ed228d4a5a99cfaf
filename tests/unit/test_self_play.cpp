// test_self_play.cpp: engine/selfplay/self_play -- move choice from visit counts (the most visited and its ties,
// sampling by visits and its frequencies), self-play games: split by global game index they equal the whole, their
// positions replay the games, outcomes agree with the final positions, policies are distributions, the statistics
// add up, and the randomness is a pure function of the seed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/check.h"
#include "engine/games/connect4.h"
#include "engine/selfplay/self_play.h"
#include "tests/common/selfplay_evaluators.h"

namespace {

using ms::games::Connect4;
using ms::games::Outcome;
using ms::selfplay::play_games;
using ms::selfplay::RootResult;
using ms::selfplay::RootSelection;
using ms::selfplay::SelfPlayGames;
using ms::selfplay::SelfPlayOptions;
using ms::test::RolloutEvaluator;
using ms::test::UniformEvaluator;

SelfPlayOptions small_options() {
    SelfPlayOptions options;
    options.mcts.simulations = 24;
    options.mcts.leaves_per_wave = 4;
    options.temperature_moves = 4;
    return options;
}

RootResult result_of(std::vector<int> visits, std::vector<float> priors, std::vector<int8_t> proven = {}) {
    RootResult r;
    r.q.assign(visits.size(), 0.0f);
    if (proven.empty()) proven.assign(visits.size(), 0);
    r.proven = std::move(proven);
    r.visits = std::move(visits);
    r.priors = std::move(priors);
    return r;
}

void expect_same_games(const SelfPlayGames& a, const SelfPlayGames& b) {
    EXPECT_EQ(a.moves, b.moves);
    ASSERT_EQ(a.positions.size(), b.positions.size());
    for (size_t i = 0; i < a.positions.size(); ++i) {
        EXPECT_EQ(a.positions[i].state, b.positions[i].state) << i;
        EXPECT_EQ(a.positions[i].policy, b.positions[i].policy) << i;
        EXPECT_EQ(a.positions[i].value, b.positions[i].value) << i;
    }
}

TEST(MoveChoice, MostVisitedBreaksTiesByPriorThenAction) {
    EXPECT_EQ(ms::selfplay::most_visited(result_of({3, 5, 2, 0}, {0.4f, 0.1f, 0.3f, 0.2f})), 1);
    EXPECT_EQ(ms::selfplay::most_visited(result_of({3, 5, 5, 0}, {0.1f, 0.2f, 0.3f, 0.4f})), 2);
    EXPECT_EQ(ms::selfplay::most_visited(result_of({5, 5, 5, 0}, {0.3f, 0.3f, 0.1f, 0.3f})), 0);
    // An unvisited action is never the choice, whatever its prior.
    EXPECT_EQ(ms::selfplay::most_visited(result_of({0, 1, 0}, {0.9f, 0.05f, 0.05f})), 1);
}

TEST(MoveChoice, TakesAProvenWinAndAvoidsProvenLosses) {
    using ms::selfplay::most_visited;
    using ms::selfplay::sample_by_visits;
    const std::vector<float> priors = {0.25f, 0.25f, 0.25f, 0.25f};
    // A proven win is played however few visits it has; of two, the more visited.
    EXPECT_EQ(most_visited(result_of({9, 2, 5, 0}, priors, {0, 1, 0, 0})), 1);
    EXPECT_EQ(most_visited(result_of({9, 2, 5, 0}, priors, {0, 1, 1, 0})), 2);
    // A proven loss is passed over while another move is open, however many visits it has.
    EXPECT_EQ(most_visited(result_of({9, 2, 5, 0}, priors, {-1, 0, -1, 0})), 1);
    // When every move loses, the most visited.
    EXPECT_EQ(most_visited(result_of({9, 2, 5, 0}, priors, {-1, -1, -1, 0})), 0);
    for (int game = 0; game < 200; ++game) {
        EXPECT_EQ(sample_by_visits(result_of({9, 2, 5, 1}, priors, {0, 0, 1, 0}), 3, game, 0), 2);
        const int pick = sample_by_visits(result_of({9, 2, 5, 1}, priors, {-1, 0, -1, 0}), 3, game, 0);
        EXPECT_TRUE(pick == 1 || pick == 3) << pick;
    }
}

TEST(MoveChoice, SamplesByVisitsFromSeedGameAndMove) {
    const RootResult r = result_of({1, 0, 3, 6}, {0.25f, 0.25f, 0.25f, 0.25f});
    constexpr int kDraws = 20000;
    std::vector<int> picks(4, 0);
    for (int game = 0; game < kDraws; ++game) ++picks[ms::selfplay::sample_by_visits(r, 3, game, 5)];
    EXPECT_EQ(picks[1], 0);
    for (const int a : {0, 2, 3}) {
        const double p = r.visits[a] / 10.0;
        // 5 standard errors of a frequency over kDraws draws.
        EXPECT_NEAR(picks[a] / static_cast<double>(kDraws), p, 5.0 * std::sqrt(p * (1.0 - p) / kDraws)) << a;
    }
    // A pure function of (seed, game, move): the same arguments draw the same, others (almost always) not.
    int differ_seed = 0, differ_move = 0;
    for (int game = 0; game < 100; ++game) {
        const int pick = ms::selfplay::sample_by_visits(r, 3, game, 5);
        EXPECT_EQ(ms::selfplay::sample_by_visits(r, 3, game, 5), pick);
        differ_seed += ms::selfplay::sample_by_visits(r, 4, game, 5) != pick;
        differ_move += ms::selfplay::sample_by_visits(r, 3, game, 6) != pick;
    }
    EXPECT_GT(differ_seed, 20);
    EXPECT_GT(differ_move, 20);
    // choose_move samples before move `temperature_moves`, then plays the most visited.
    int sampled_not_most = 0;
    for (int game = 0; game < 100; ++game) {
        EXPECT_EQ(ms::selfplay::choose_move(r, 4, 3, game, 3), ms::selfplay::sample_by_visits(r, 3, game, 3));
        EXPECT_EQ(ms::selfplay::choose_move(r, 4, 3, game, 4), 3);
        sampled_not_most += ms::selfplay::choose_move(r, 4, 3, game, 3) != 3;
    }
    EXPECT_GT(sampled_not_most, 20);
}

TEST(SelfPlay, ValueTargetsMixTheOutcomeWithTheSearchValue) {
    // The same games whatever the mix (it changes targets, not moves); w = 1/2 is the average of w = 0 (the
    // outcome) and w = 1 (the root value), to the float rounding of (1 - w) z + w q.
    RolloutEvaluator evaluator;
    SelfPlayOptions options = small_options();
    const SelfPlayGames outcome = play_games(evaluator, 4, 5, options, 5, 0, 6);
    options.value_from_search = 1.0f;
    const SelfPlayGames search = play_games(evaluator, 4, 5, options, 5, 0, 6);
    options.value_from_search = 0.5f;
    const SelfPlayGames half = play_games(evaluator, 4, 5, options, 5, 0, 6);
    EXPECT_EQ(outcome.moves, search.moves);
    EXPECT_EQ(outcome.moves, half.moves);
    ASSERT_EQ(outcome.positions.size(), half.positions.size());
    int differ = 0;
    for (size_t i = 0; i < half.positions.size(); ++i) {
        const float z = outcome.positions[i].value, q = search.positions[i].value;
        EXPECT_TRUE(z == -1.0f || z == 0.0f || z == 1.0f) << z;
        EXPECT_LE(std::abs(q), 1.0f);
        EXPECT_EQ(half.positions[i].value, 0.5f * z + 0.5f * q) << i;
        differ += q != z;
    }
    EXPECT_GT(differ, static_cast<int>(half.positions.size()) / 2);  // the search's values are not the outcomes
    options.value_from_search = 1.5f;
    EXPECT_THROW(play_games(evaluator, 4, 5, options, 5, 0, 1), ms::UserError);
}

TEST(SelfPlay, SplitByGameIndexEqualsTheWhole) {
    // How data-parallel ranks split a step's games: games [0, 4) at once, or [0, 2) and [2, 4) apart; with fresh
    // trees and with each game's tree reused from move to move.
    for (const RootSelection root : {RootSelection::kPuct, RootSelection::kGumbel}) {
        int64_t evaluated[2] = {0, 0};
        for (const bool reuse : {false, true}) {
            SCOPED_TRACE(testing::Message() << (reuse ? "reuse_tree" : "fresh trees")
                                            << (root == RootSelection::kGumbel ? ", Gumbel" : ", PUCT"));
            RolloutEvaluator evaluator(16);
            SelfPlayOptions options = small_options();
            options.mcts.reuse_tree = reuse;
            options.mcts.root = root;
            if (root == RootSelection::kGumbel) options.mcts.noise_fraction = 0.0f;
            const SelfPlayGames whole = play_games(evaluator, 4, 5, options, 7, 0, 4);
            SelfPlayGames first = play_games(evaluator, 4, 5, options, 7, 0, 2);
            const SelfPlayGames second = play_games(evaluator, 4, 5, options, 7, 2, 2);
            EXPECT_EQ(first.stats.positions_evaluated + second.stats.positions_evaluated,
                      whole.stats.positions_evaluated);
            EXPECT_EQ(first.stats.moves + second.stats.moves, whole.stats.moves);
            EXPECT_EQ(first.stats.first_player_wins + second.stats.first_player_wins, whole.stats.first_player_wins);
            EXPECT_EQ(first.stats.draws + second.stats.draws, whole.stats.draws);
            first.positions.insert(first.positions.end(), second.positions.begin(), second.positions.end());
            first.moves.insert(first.moves.end(), second.moves.begin(), second.moves.end());
            expect_same_games(first, whole);
            // One game alone, from the middle.
            const SelfPlayGames third = play_games(evaluator, 4, 5, options, 7, 2, 1);
            EXPECT_EQ(third.moves.front(), whole.moves[2]);
            evaluated[reuse] = whole.stats.positions_evaluated / whole.stats.moves;
        }
        // Each move's search starts from the visits its previous move's search spent below it.
        EXPECT_LT(evaluated[1], evaluated[0]);
    }
}

// With tree reuse too: a reused root that the previous search had proven holds visits that stopped at it (a proven
// node is a leaf to the search), so its children's visits sum to fewer than the simulations, and the policy target
// is their distribution, not visits / simulations.
TEST(SelfPlay, PositionsReplayTheGamesAndOutcomesAgreeWithTheirEnds) {
    for (const bool reuse : {false, true}) {
        SCOPED_TRACE(reuse ? "reuse_tree" : "fresh trees");
        RolloutEvaluator evaluator;
        SelfPlayOptions options = small_options();
        options.mcts.reuse_tree = reuse;
        const SelfPlayGames out = play_games(evaluator, 4, 5, options, 11, 30, 12);
        ASSERT_EQ(out.moves.size(), 12u);
        size_t next = 0;  // the first position of the game
        int wins[2] = {0, 0}, draws = 0;
        for (const std::string& moves : out.moves) {
            SCOPED_TRACE(moves);
            const Connect4 end = Connect4::from_moves(4, 5, moves);
            ASSERT_NE(end.outcome(), Outcome::kOngoing);
            const bool drawn = end.outcome() == Outcome::kDraw;
            const int winner = (end.move_count() - 1) & 1;  // the side that moved last
            drawn ? ++draws : ++wins[winner];
            for (size_t m = 0; m < moves.size(); ++m) {
                ASSERT_LT(next + m, out.positions.size());
                const auto& p = out.positions[next + m];
                EXPECT_EQ(p.state, Connect4::from_moves(4, 5, moves.substr(0, m)));
                EXPECT_EQ(p.value, drawn ? 0.0f : static_cast<int>(m & 1) == winner ? 1.0f : -1.0f) << m;
                ASSERT_EQ(p.policy.size(), 5u);
                float total = 0.0f;
                for (int a = 0; a < 5; ++a) {
                    if (!p.state.is_legal(a)) {
                        EXPECT_EQ(p.policy[a], 0.0f);
                    }
                    total += p.policy[a];
                }
                // Visits / their sum in float, 5 terms: a few float ulps off 1.
                EXPECT_NEAR(total, 1.0f, 1e-6f) << m;
                EXPECT_GT(p.policy[moves[m] - '1'], 0.0f);  // the move played was searched
            }
            next += moves.size();
        }
        EXPECT_EQ(next, out.positions.size());
        const ms::selfplay::SelfPlayStats& s = out.stats;
        EXPECT_EQ(s.games, 12);
        EXPECT_EQ(s.moves, static_cast<int64_t>(out.positions.size()));
        EXPECT_EQ(s.positions, s.moves);
        EXPECT_EQ(s.first_player_wins, wins[0]);
        EXPECT_EQ(s.second_player_wins, wins[1]);
        EXPECT_EQ(s.draws, draws);
        EXPECT_EQ(s.mean_game_length, static_cast<double>(s.moves) / 12);
        EXPECT_EQ(s.positions_evaluated, evaluator.rows());
        EXPECT_EQ(s.evaluate_calls, evaluator.calls());
    }
}

TEST(SelfPlay, RandomnessIsAPureFunctionOfTheSeed) {
    UniformEvaluator evaluator;
    SelfPlayOptions options = small_options();
    // Without noise or sampling every game is the same game: the search is deterministic.
    options.mcts.noise_fraction = 0.0f;
    options.temperature_moves = 0;
    const SelfPlayGames fixed = play_games(evaluator, 4, 5, options, 1, 0, 6);
    for (const std::string& moves : fixed.moves) EXPECT_EQ(moves, fixed.moves.front());
    EXPECT_EQ(play_games(evaluator, 4, 5, options, 2, 0, 1).moves.front(), fixed.moves.front());

    // Sampling alone, then noise alone: the games differ from one another, and replay from the seed.
    for (const bool sampling : {true, false}) {
        SCOPED_TRACE(sampling ? "temperature" : "noise");
        options.temperature_moves = sampling ? 4 : 0;
        options.mcts.noise_fraction = sampling ? 0.0f : 0.25f;
        const SelfPlayGames a = play_games(evaluator, 4, 5, options, 1, 0, 6);
        expect_same_games(play_games(evaluator, 4, 5, options, 1, 0, 6), a);
        EXPECT_NE(play_games(evaluator, 4, 5, options, 2, 0, 6).moves, a.moves);
        int distinct = 0;
        for (size_t g = 0; g < a.moves.size(); ++g) distinct += a.moves[g] != a.moves[0];
        EXPECT_GT(distinct, 0);
    }
}

// Playout-cap randomisation: a game's moves are full searches where full_search draws so (about the fraction of
// them), and only those moves' positions are kept, in order, each the game's state before its move; with a fraction
// of 1 the games are exactly those without it. The fast searches make the games cheaper: fewer rows evaluated.
TEST(SelfPlay, PlayoutCapKeepsTheFullSearchesPositions) {
    SelfPlayOptions options = small_options();
    options.mcts.reuse_tree = true;
    RolloutEvaluator plain_evaluator;
    const SelfPlayGames plain = play_games(plain_evaluator, 4, 5, options, 7, 40, 16);
    options.fast_simulations = 4;
    RolloutEvaluator all_full_evaluator;
    expect_same_games(play_games(all_full_evaluator, 4, 5, options, 7, 40, 16), plain);

    options.full_search_fraction = 0.25f;
    RolloutEvaluator evaluator;
    const SelfPlayGames out = play_games(evaluator, 4, 5, options, 7, 40, 16);
    ASSERT_EQ(out.moves.size(), 16u);
    size_t next = 0;
    int64_t moves = 0;
    for (size_t g = 0; g < out.moves.size(); ++g) {
        const std::string& game = out.moves[g];
        SCOPED_TRACE(game);
        moves += static_cast<int64_t>(game.size());
        for (size_t m = 0; m < game.size(); ++m) {
            if (!ms::selfplay::full_search(options, 7, 40 + g, static_cast<int>(m))) continue;
            ASSERT_LT(next, out.positions.size());
            EXPECT_EQ(out.positions[next].state, Connect4::from_moves(4, 5, game.substr(0, m))) << m;
            EXPECT_GT(out.positions[next].policy[static_cast<size_t>(game[m] - '1')], 0.0f) << m;
            ++next;
        }
    }
    EXPECT_EQ(next, out.positions.size());
    EXPECT_EQ(out.stats.moves, moves);
    EXPECT_EQ(out.stats.positions, static_cast<int64_t>(next));
    // a quarter of the moves, give or take: 16 games of some 15 moves
    EXPECT_GT(next, static_cast<size_t>(moves) / 8);
    EXPECT_LT(next, static_cast<size_t>(moves) / 2);
    // rows per move: a quarter of 24 simulations and three quarters of 4 would be 0.375 of the plain games'; proofs
    // and the trees kept between moves make it 0.52 here
    EXPECT_LT(evaluator.rows() * 3,
              plain_evaluator.rows() * 2 * static_cast<int64_t>(moves) / static_cast<int64_t>(plain.stats.moves));
}

TEST(SelfPlay, RefusesBadOptionsWithASentence) {
    UniformEvaluator evaluator;
    SelfPlayOptions options = small_options();
    options.temperature_moves = -1;
    try {
        play_games(evaluator, 4, 5, options, 0, 0, 1);
        ADD_FAILURE() << "no UserError";
    } catch (const ms::UserError& e) {
        EXPECT_STREQ(e.what(), "config error: selfplay.temperature_moves = -1 must be in [0, 65536]");
    }
    EXPECT_THROW(play_games(evaluator, 3, 5, small_options(), 0, 0, 1), ms::UserError);  // no 3-row board
    options = small_options();
    options.mcts.simulations = 0;
    EXPECT_THROW(play_games(evaluator, 4, 5, options, 0, 0, 1), ms::UserError);
    options = small_options();
    options.full_search_fraction = 0.5f;
    options.fast_simulations = 24;
    try {
        play_games(evaluator, 4, 5, options, 0, 0, 1);
        ADD_FAILURE() << "no UserError";
    } catch (const ms::UserError& e) {
        EXPECT_STREQ(e.what(),
                     "config error: selfplay.fast_simulations = 24 must be at least 1 and fewer than the stage's 24 "
                     "simulations when selfplay.full_search_fraction (0.5) is below 1");
    }
    options.full_search_fraction = 0.0f;
    EXPECT_THROW(play_games(evaluator, 4, 5, options, 0, 0, 1), ms::UserError);
}

}  // namespace
