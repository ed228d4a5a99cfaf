// selfplay_evaluators.h: fake networks for the self-play tests (engine/selfplay/evaluator.h), each row-independent
// and a pure function of the position, so a search's result depends on nothing but its inputs:
//   UniformEvaluator  uniform priors over the legal moves, value 0: the search alone plays;
//   SolverEvaluator   uniform priors, the value the sign of alpha-beta's full solve (small boards only);
//   RolloutEvaluator  priors hashed from the position, the value the result of one random playout seeded by it.
// Each counts its calls and rows, keeps the largest batch it was handed, and checks that it is never handed more than
// max_batch() positions or a finished game.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <span>
#include <unordered_map>

#include "engine/core/philox.h"
#include "engine/games/alpha_beta.h"
#include "engine/games/connect4.h"
#include "engine/selfplay/evaluator.h"

namespace ms::test {

class CountingEvaluator : public selfplay::Evaluator<games::Connect4> {
  public:
    explicit CountingEvaluator(int max_batch) : max_batch_(max_batch) {}

    void evaluate(std::span<const games::Connect4> positions, std::span<float> priors, std::span<float> values) final {
        EXPECT_GE(positions.size(), 1u);
        EXPECT_LE(positions.size(), static_cast<size_t>(max_batch_));
        ++calls_;
        rows_ += static_cast<int64_t>(positions.size());
        largest_batch_ = std::max(largest_batch_, static_cast<int>(positions.size()));
        for (size_t i = 0; i < positions.size(); ++i) {
            const games::Connect4& state = positions[i];
            EXPECT_EQ(state.outcome(), games::Outcome::kOngoing) << state.to_string();
            const size_t actions = static_cast<size_t>(state.num_actions());
            EXPECT_EQ(priors.size(), positions.size() * actions);
            values[i] = evaluate_one(state, priors.subspan(i * actions, actions));
        }
    }
    int max_batch() const final { return max_batch_; }

    int64_t calls() const { return calls_; }
    int64_t rows() const { return rows_; }
    int largest_batch() const { return largest_batch_; }

  protected:
    // Writes the position's priors (0 on illegal moves) and returns its value.
    virtual float evaluate_one(const games::Connect4& state, std::span<float> priors) = 0;

    static void uniform_priors(const games::Connect4& state, std::span<float> priors) {
        const uint64_t legal = state.legal_moves();
        const float p = 1.0f / static_cast<float>(std::popcount(legal));
        for (size_t a = 0; a < priors.size(); ++a) priors[a] = (legal >> a) & 1 ? p : 0.0f;
    }

  private:
    int max_batch_;
    int64_t calls_ = 0;
    int64_t rows_ = 0;
    int largest_batch_ = 0;
};

class UniformEvaluator final : public CountingEvaluator {
  public:
    explicit UniformEvaluator(int max_batch = 64) : CountingEvaluator(max_batch) {}

  protected:
    float evaluate_one(const games::Connect4& state, std::span<float> priors) override {
        uniform_priors(state, priors);
        return 0.0f;
    }
};

// Exact values: +1 a forced win for the side to move, 0 a draw, -1 a forced loss. The solves are cached by the
// position's key, which is exact among positions of one board: use one evaluator per board size.
class SolverEvaluator final : public CountingEvaluator {
  public:
    explicit SolverEvaluator(int max_batch = 64) : CountingEvaluator(max_batch), solver_(16) {}

  protected:
    float evaluate_one(const games::Connect4& state, std::span<float> priors) override {
        uniform_priors(state, priors);
        auto [it, inserted] = values_.try_emplace(state.key(), 0.0f);
        if (inserted) {
            const int score = solver_.search(state, {}).score;
            it->second = score > 0 ? 1.0f : score < 0 ? -1.0f : 0.0f;
        }
        return it->second;
    }

  private:
    games::AlphaBeta solver_;
    std::unordered_map<uint64_t, float> values_;
};

// Non-uniform priors and values that vary from position to position, both a function of the position's key alone.
class RolloutEvaluator final : public CountingEvaluator {
  public:
    explicit RolloutEvaluator(int max_batch = 64) : CountingEvaluator(max_batch) {}

  protected:
    float evaluate_one(const games::Connect4& state, std::span<float> priors) override {
        const uint64_t legal = state.legal_moves();
        float sum = 0.0f;
        for (size_t a = 0; a < priors.size(); ++a) {
            priors[a] =
                (legal >> a) & 1 ? 0.1f + static_cast<float>(philox_uniform_double(kSalt, state.key(), a)) : 0.0f;
            sum += priors[a];
        }
        for (float& p : priors) p /= sum;
        games::Connect4 playout = state;
        while (playout.outcome() == games::Outcome::kOngoing) playout.play(games::random_move(playout, kSalt));
        if (playout.outcome() == games::Outcome::kDraw) return 0.0f;
        // The last mover won: the side to move at `state` if it moved last.
        return (playout.move_count() - state.move_count()) % 2 == 1 ? 1.0f : -1.0f;
    }

  private:
    static constexpr uint64_t kSalt = 0x5eed;
};

}  // namespace ms::test
