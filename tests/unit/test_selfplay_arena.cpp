// test_selfplay_arena.cpp: engine/selfplay/arena -- evaluation matches (test_arena.cpp is the memory arena's): the
// agent with a uniform evaluator and alpha-beta beat the random player, exact values never lose, the tallies agree
// with the games' move strings per colour, matches replay from their seed, the agent's searches are batched across
// games without noise, and the refusals.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/check.h"
#include "engine/games/connect4.h"
#include "engine/selfplay/arena.h"
#include "tests/common/selfplay_evaluators.h"

namespace {

using ms::games::Connect4;
using ms::games::Outcome;
using ms::selfplay::MatchResult;
using ms::selfplay::MctsOptions;
using ms::selfplay::play_match;
using ms::selfplay::Player;
using ms::selfplay::Tally;
using ms::test::SolverEvaluator;
using ms::test::UniformEvaluator;

MctsOptions with_simulations(int simulations) {
    MctsOptions options;
    options.simulations = simulations;
    return options;
}

// Each game's moves replay to a finished game, and the tallies are those games' results for `player`.
void expect_tallies_agree_with_games(const MatchResult& r, int rows, int cols, int games) {
    ASSERT_EQ(static_cast<int>(r.moves.size()), games);
    Tally first, second;
    for (int g = 0; g < games; ++g) {
        SCOPED_TRACE(r.moves[g]);
        const Connect4 end = Connect4::from_moves(rows, cols, r.moves[g]);
        ASSERT_NE(end.outcome(), Outcome::kOngoing);
        Tally& colour = g % 2 == 0 ? first : second;
        const bool player_moved_last = ((end.move_count() - 1) & 1) == (g & 1);
        if (end.outcome() == Outcome::kDraw) {
            ++colour.draws;
        } else {
            ++(player_moved_last ? colour.wins : colour.losses);
        }
    }
    for (const auto& [got, want] : {std::pair{r.as_first, first}, {r.as_second, second}}) {
        EXPECT_EQ(got.wins, want.wins);
        EXPECT_EQ(got.draws, want.draws);
        EXPECT_EQ(got.losses, want.losses);
    }
    EXPECT_EQ(r.as_first.games(), (games + 1) / 2);
    EXPECT_EQ(r.as_second.games(), games / 2);
    EXPECT_EQ(r.total.wins, r.as_first.wins + r.as_second.wins);
    EXPECT_EQ(r.total.draws, r.as_first.draws + r.as_second.draws);
    EXPECT_EQ(r.total.losses, r.as_first.losses + r.as_second.losses);
    EXPECT_EQ(r.total.games(), games);
    EXPECT_EQ(r.distinct_games, static_cast<int>(std::set<std::string>(r.moves.begin(), r.moves.end()).size()));
}

TEST(Match, AgentWithAUniformEvaluatorBeatsRandom) {
    // Measured with these options over seeds 1..8 of 100 games each: 83..94 wins (90 on average), 0..3 losses,
    // the rest draws: with every value 0 the search ties the opening moves and takes the first column, and the
    // small board's endgames are zugzwangs even a random player can win. The bounds leave that spread room.
    UniformEvaluator evaluator(1024);
    const MatchResult r = play_match(Player::agent(evaluator, with_simulations(400)), Player::random(), 4, 5, 100, 1);
    expect_tallies_agree_with_games(r, 4, 5, 100);
    EXPECT_GE(r.total.wins, 80);
    EXPECT_LE(r.total.losses, 5);
    EXPECT_GT(r.distinct_games, 50);  // the random player's draws make the games
}

TEST(Match, AlphaBetaDepthFourBeatsRandom) {
    // Measured over seeds 1..4 of 40 games: 40 wins on 6 x 7; 38..40 wins and the rest draws on 4 x 5.
    const MatchResult standard = play_match(Player::alpha_beta(4), Player::random(), 6, 7, 40, 1);
    expect_tallies_agree_with_games(standard, 6, 7, 40);
    EXPECT_GE(standard.total.wins, 38);
    EXPECT_EQ(standard.total.losses, 0);
    const MatchResult small = play_match(Player::alpha_beta(4), Player::random(), 4, 5, 40, 1);
    expect_tallies_agree_with_games(small, 4, 5, 40);
    EXPECT_GE(small.total.wins, 34);
    EXPECT_EQ(small.total.losses, 0);
    EXPECT_EQ(small.search.searches, 0);  // no evaluator, no tree search
}

TEST(Match, ExactValuesNeverLose) {
    // 4 x 5 is a draw with best play: the agent guided by the solver's values draws the solver and never loses.
    SolverEvaluator exact(1024);
    const Player agent = Player::agent(exact, with_simulations(50));
    const MatchResult solver = play_match(agent, Player::alpha_beta(0), 4, 5, 10, 3);
    expect_tallies_agree_with_games(solver, 4, 5, 10);
    EXPECT_EQ(solver.total.draws, 10);
    const MatchResult random = play_match(agent, Player::random(), 4, 5, 20, 3);
    expect_tallies_agree_with_games(random, 4, 5, 20);
    EXPECT_EQ(random.total.losses, 0);
    EXPECT_GE(random.total.wins, 18);  // measured: 20 wins of 20
}

TEST(Match, TalliesAgreeWithTheGamesAndReplayFromTheSeed) {
    for (const int games : {1, 7, 30}) {
        SCOPED_TRACE(games);
        const MatchResult r = play_match(Player::random(), Player::random(), 4, 5, games, 9);
        expect_tallies_agree_with_games(r, 4, 5, games);
        EXPECT_EQ(play_match(Player::random(), Player::random(), 4, 5, games, 9).moves, r.moves);
    }
    const MatchResult a = play_match(Player::alpha_beta(2), Player::random(), 5, 6, 12, 4);
    expect_tallies_agree_with_games(a, 5, 6, 12);
    EXPECT_EQ(play_match(Player::alpha_beta(2), Player::random(), 5, 6, 12, 4).moves, a.moves);
    EXPECT_NE(play_match(Player::alpha_beta(2), Player::random(), 5, 6, 12, 5).moves, a.moves);
    // The two sides of one game draw apart: a random player against itself is not one player moving twice.
    const MatchResult self = play_match(Player::random(), Player::random(), 6, 7, 20, 4);
    EXPECT_EQ(self.distinct_games, 20);
}

TEST(Match, AgentSearchesEveryGameInOneBatchWithoutNoise) {
    // 24 games: the agent moves in 12 of them at every step, so its evaluator sees the roots of 12 games at once
    // and waves of up to 12 x leaves_per_wave leaves.
    UniformEvaluator evaluator(1024);
    MctsOptions options = with_simulations(40);
    options.leaves_per_wave = 8;
    const Player agent = Player::agent(evaluator, options);
    EXPECT_EQ(agent.mcts.noise_fraction, 0.0f);
    const MatchResult r = play_match(agent, Player::random(), 4, 5, 24, 2);
    expect_tallies_agree_with_games(r, 4, 5, 24);
    EXPECT_GT(evaluator.largest_batch(), 12 * 4);
    EXPECT_EQ(r.search.evaluate_calls, evaluator.calls());
    EXPECT_EQ(r.search.positions_evaluated, evaluator.rows());
    // Two searching players without noise play one game per colour: nothing random is left.
    ms::test::RolloutEvaluator other(1024);
    const MatchResult both = play_match(agent, Player::agent(other, with_simulations(30)), 4, 5, 6, 2);
    expect_tallies_agree_with_games(both, 4, 5, 6);
    EXPECT_EQ(both.distinct_games, 2);
    size_t moves = 0;
    for (const std::string& game : both.moves) moves += game.size();
    EXPECT_EQ(both.search.searches, static_cast<int64_t>(moves));  // every move a search
}

TEST(Match, PairedOpeningsVaryTheGamesAndSwapColours) {
    // The two deterministic searchers above, with 2 random opening plies: games 2i and 2i + 1 start alike (the
    // colours swapped), the pairs differ, and the searches begin after the opening.
    UniformEvaluator evaluator(1024);
    ms::test::RolloutEvaluator other(1024);
    const Player agent = Player::agent(evaluator, with_simulations(40));
    const MatchResult r = play_match(agent, Player::agent(other, with_simulations(30)), 4, 5, 12, 2, 2);
    expect_tallies_agree_with_games(r, 4, 5, 12);
    std::set<std::string> openings;
    size_t moves = 0;
    for (size_t g = 0; g < 12; g += 2) {
        EXPECT_EQ(r.moves[g].substr(0, 2), r.moves[g + 1].substr(0, 2)) << g;
        openings.insert(r.moves[g].substr(0, 2));
        moves += r.moves[g].size() + r.moves[g + 1].size();
    }
    EXPECT_GE(openings.size(), 3u);
    EXPECT_GT(r.distinct_games, 2);
    EXPECT_EQ(r.search.searches, static_cast<int64_t>(moves) - 12 * 2);
    // no opening: the two lines of the test above
    EXPECT_EQ(play_match(agent, Player::agent(other, with_simulations(30)), 4, 5, 12, 2).distinct_games, 2);
}

TEST(Match, APartOfTheGamesPlaysThemAsTheWholeMatchDoes) {
    // How data-parallel ranks share an evaluation: games [0, 4), [4, 10) and [10, 12) apart equal the match of 12
    // (the agent reusing its trees over its moves and the opponent's replies, a row-independent evaluator).
    ms::test::RolloutEvaluator evaluator(1024);
    MctsOptions options = with_simulations(40);
    options.reuse_tree = true;
    const Player agent = Player::agent(evaluator, options);
    const MatchResult whole = play_match(agent, Player::alpha_beta(2), 5, 6, 12, 8, 2);
    EXPECT_GT(whole.search.reused, 0);
    Tally first, second;
    std::vector<std::string> moves;
    for (const auto& [begin, end] : std::vector<std::pair<int, int>>{{0, 4}, {4, 10}, {10, 12}}) {
        const MatchResult part = play_match(agent, Player::alpha_beta(2), 5, 6, 12, 8, 2, {begin, end});
        ASSERT_EQ(part.moves.size(), static_cast<size_t>(end - begin));
        moves.insert(moves.end(), part.moves.begin(), part.moves.end());
        first += part.as_first;
        second += part.as_second;
    }
    EXPECT_EQ(moves, whole.moves);
    EXPECT_EQ(first.wins, whole.as_first.wins);
    EXPECT_EQ(first.draws, whole.as_first.draws);
    EXPECT_EQ(second.wins, whole.as_second.wins);
    EXPECT_EQ(second.losses, whole.as_second.losses);
    EXPECT_EQ(first.games() + second.games(), 12);
}

TEST(Match, NamesAndRefusals) {
    UniformEvaluator evaluator;
    EXPECT_EQ(Player::random().name(), "random");
    EXPECT_EQ(Player::alpha_beta(4).name(), "alpha-beta depth 4");
    EXPECT_EQ(Player::alpha_beta(0).name(), "alpha-beta solver");
    EXPECT_EQ(Player::agent(evaluator, with_simulations(200)).name(), "mcts 200 simulations");
    try {
        play_match(Player::random(), Player::random(), 4, 5, 0, 1);
        ADD_FAILURE() << "no UserError";
    } catch (const ms::UserError& e) {
        EXPECT_STREQ(e.what(),
                     "config error: selfplay.eval_games = 0 must be >= 1: an evaluation match plays at least one game");
    }
    EXPECT_THROW(play_match(Player::random(), Player::random(), 4, 10, 2, 1), ms::UserError);
    EXPECT_THROW(play_match(Player::agent(evaluator, with_simulations(0)), Player::random(), 4, 5, 2, 1),
                 ms::UserError);
}

}  // namespace
