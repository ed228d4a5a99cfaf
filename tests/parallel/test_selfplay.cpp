// `mindspeed-train selfplay` (engine/selfplay/selfplay_train.h) with the real binary on tests/parallel/
// tiny-selfplay.yaml: data and tensor parallelism against one rank, an exact resume across a curriculum stage, and
// the configs it refuses with a sentence.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tests/common/temp_dir.h"
#include "tests/common/train_run.h"
#include "tests/e2e/run_cli.h"

namespace ms::test {
namespace {

const std::string kConfig = MS_SOURCE_DIR "/tests/parallel/tiny-selfplay.yaml";

TrainRun run_selfplay(int ranks, const std::string& dir, const std::string& sets = "") {
    return run_train({.binary = MS_BINARY_PATH,
                      .config = kConfig,
                      .sets = sets,
                      .ranks = ranks,
                      .launcher = "mpiexec --oversubscribe --allow-run-as-root",
                      .env = "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive",
                      .timeout_s = 120,
                      .command = "selfplay",
                      .output_dir = dir});
}

std::string file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    EXPECT_TRUE(in.good()) << path;
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
std::string replay_file(const std::string& dir, int iteration) {
    return file_bytes(dir + "/ckpt/iter_000000" + std::to_string(iteration) + "/selfplay_replay.bin");
}

// Every rank plays whole groups of games, numbered over the run, and a group's batches are the same whichever rank
// plays it: the first iteration's positions are the same bits on dp2 and tp2 as on one rank. The steps may then
// differ by the rounding of the gradient's sum over ranks (measured on these 3 iterations: dp2 9.2e-8 relative, one
// ulp of the first loss, then equal; tp2 equal), and later iterations' games agree as long as that rounding changes
// no move.
TEST(SelfPlay, DataAndTensorParallelRunsPlayTheSameGamesAsOneRank) {
    const TempDir one("ms_selfplay"), dp2("ms_selfplay"), tp2("ms_selfplay");
    const TrainRun base = run_selfplay(1, one.path());
    const TrainRun dp = run_selfplay(2, dp2.path());
    const TrainRun tp = run_selfplay(2, tp2.path(), "--set parallel.tensor_model_parallel_size=2");
    ASSERT_EQ(base.losses.size(), 3u) << base.output;
    EXPECT_EQ(replay_file(one.path(), 1), replay_file(dp2.path(), 1));
    EXPECT_EQ(replay_file(one.path(), 1), replay_file(tp2.path(), 1));
    for (const TrainRun* r : {&dp, &tp}) {
        ASSERT_EQ(r->losses.size(), 3u) << r->output;
        for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(r->losses[i], base.losses[i], 1e-5 * base.losses[i]) << i;
    }
    // The evaluation after iteration 1 shares its games over the dp ranks (tp2: one share) and gathers the result:
    // the same record as one rank's, but for the time it took.
    const auto first_evaluation = [](const std::string& dir) {
        std::ifstream in(dir + "/metrics.jsonl");
        for (std::string line; std::getline(in, line);) {
            nlohmann::json record = nlohmann::json::parse(line);
            if (!record.contains("vs random")) continue;
            record.erase("seconds");
            return record;
        }
        return nlohmann::json();
    };
    EXPECT_EQ(first_evaluation(one.path()).dump(), first_evaluation(dp2.path()).dump());
    EXPECT_EQ(first_evaluation(one.path()).dump(), first_evaluation(tp2.path()).dump());
    EXPECT_EQ(first_evaluation(one.path())["vs random"]["distinct games"], 4) << first_evaluation(one.path());
    // the curriculum moved to 4 x 5 after the first evaluation (promote_score 0) on every layout
    for (const TrainRun* r : {&base, &dp, &tp})
        EXPECT_NE(r->output.find("curriculum stage 2 (4 x 5, 12 simulations)"), std::string::npos) << r->output;
}

// selfplay.search: gumbel (Gumbel root selection, completed-Q policy targets) through the command: dp2's first
// iteration puts the same positions and targets into the buffer as one rank's, and other ones than PUCT's.
TEST(SelfPlay, GumbelSearchPlaysTheSameGamesOnDp2AsOneRank) {
    const TempDir one("ms_selfplay"), dp2("ms_selfplay");
    const std::string gumbel = "--set selfplay.search=gumbel --set training.train_iters=1";
    const TrainRun base = run_selfplay(1, one.path(), gumbel);
    const TrainRun dp = run_selfplay(2, dp2.path(), gumbel);
    ASSERT_EQ(base.losses.size(), 1u) << base.output;
    ASSERT_EQ(dp.losses.size(), 1u) << dp.output;
    EXPECT_EQ(replay_file(one.path(), 1), replay_file(dp2.path(), 1));
    const TrainRun puct = run_selfplay(1, dp2.path() + "/puct", "--set training.train_iters=1");
    ASSERT_EQ(puct.losses.size(), 1u) << puct.output;
    EXPECT_NE(replay_file(one.path(), 1), replay_file(dp2.path() + "/puct", 1));
}

// A run stopped after iteration 2 and resumed (network, AdamW moments, replay buffer, curriculum stage) continues
// as the straight run does, bit for bit: the same loss and the same replay buffer after iteration 3.
TEST(SelfPlay, ResumeContinuesBitIdentically) {
    const TempDir straight("ms_selfplay"), stopped("ms_selfplay");
    const TrainRun full = run_selfplay(1, straight.path());
    run_selfplay(1, stopped.path(), "--set training.train_iters=2");
    const TrainRun resumed = run_selfplay(1, stopped.path(), "--set checkpoint.load=" + stopped.path() + "/ckpt");
    ASSERT_EQ(full.losses.size(), 3u) << full.output;
    ASSERT_EQ(resumed.losses.size(), 3u) << resumed.output;  // the metrics continue the first part's
    EXPECT_EQ(resumed.losses, full.losses);
    EXPECT_NE(resumed.output.find("resumed at iteration 2, curriculum stage 2"), std::string::npos) << resumed.output;
    EXPECT_EQ(replay_file(stopped.path(), 3), replay_file(straight.path(), 3));
}

// `report` on a self-play run (with a final evaluation of its own size): its losses, the evaluation matches' win rate
// per opponent (one point per evaluation) and the search's throughput, charted.
TEST(SelfPlay, ReportChartsTheWinRatePerIteration) {
    const TempDir dir("ms_selfplay");
    const TrainRun run = run_selfplay(
        1, dir.path(),
        "--set 'selfplay.eval_opponents=[\"random\", \"alphabeta:2\"]' --set selfplay.final_eval_games=6 --set "
        "selfplay.final_eval_simulations=16");
    ASSERT_EQ(run.losses.size(), 3u) << run.output;
    // the last iteration's evaluation is the final one: its own games and search
    EXPECT_NE(run.output.find("iteration     3/    3 | evaluation on 4 x 5 vs random: won"), std::string::npos);
    EXPECT_NE(run.output.find(" of 6 (score"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("iteration     2/    3 | evaluation on 4 x 5 vs random: won"), std::string::npos);
    const CliResult report = run_cli("report " + dir.path());
    ASSERT_EQ(report.exit_code, 0) << report.output;
    const std::string html = file_bytes(dir.path() + "/report.html");
    for (const char* chart : {"chart-selfplay-loss", "chart-win-rate", "chart-selfplay-throughput"})
        EXPECT_NE(html.find(std::string("id=\"") + chart + "\""), std::string::npos) << chart;
    for (const char* series :
         {"data-series=\"vs random\" data-points=\"3\"", "data-series=\"vs alphabeta:2\" data-points=\"3\"",
          "data-series=\"policy\" data-points=\"3\""})
        EXPECT_NE(html.find(series), std::string::npos) << series;
    EXPECT_NE(html.find("last evaluation vs random"), std::string::npos);
}

// `eval` of a self-play checkpoint plays the trainer's final evaluation on one rank: with the run's config, the
// final checkpoint of a dp2 run (the evaluation's games shared over two ranks and gathered) gives the run's own final
// record, every count equal; another budget (--set selfplay.final_eval_simulations) plays other games. A checkpoint of
// another model family, --iters, and a network of another shape are refused with a sentence.
TEST(SelfPlay, EvalOfTheFinalCheckpointIsTheRunsFinalEvaluation) {
    const TempDir dir("ms_selfplay");
    const std::string final_eval =
        "--set 'selfplay.eval_opponents=[\"random\", \"alphabeta:2\"]' --set "
        "selfplay.final_eval_games=6 --set selfplay.final_eval_simulations=16";
    const TrainRun run = run_selfplay(2, dir.path(), final_eval);
    ASSERT_EQ(run.losses.size(), 3u) << run.output;
    nlohmann::json trained;
    std::ifstream metrics(dir.path() + "/metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) {
        const nlohmann::json record = nlohmann::json::parse(line);
        if (record.contains("vs alphabeta:2")) trained = record;  // the last one: the final evaluation
    }
    ASSERT_EQ(trained["iteration"], 3) << trained;
    ASSERT_EQ(trained["simulations"], 16) << trained;
    const std::string eval = "eval --json --config " + kConfig + " --load " + dir.path() + "/ckpt " + final_eval;
    const CliStreams same = run_cli_streams(eval);
    ASSERT_EQ(same.exit_code, 0) << same.errors;
    nlohmann::json evaluated = nlohmann::json::parse(same.output);
    EXPECT_EQ(evaluated["checkpoint"], dir.path() + "/ckpt/iter_0000003") << evaluated;
    for (nlohmann::json* record : {&trained, &evaluated}) {
        record->erase("seconds");
        record->erase("checkpoint");
    }
    EXPECT_EQ(evaluated.dump(), trained.dump());
    EXPECT_EQ(evaluated["vs alphabeta:2"]["wins"].get<int>() + evaluated["vs alphabeta:2"]["draws"].get<int>() +
                  evaluated["vs alphabeta:2"]["losses"].get<int>(),
              6)
        << evaluated;
    EXPECT_NE(same.errors.find("eval: iteration 3 | evaluation on 4 x 5 vs alphabeta:2: won"), std::string::npos)
        << same.errors;

    const CliStreams longer = run_cli_streams(eval + " --set selfplay.final_eval_simulations=32");
    ASSERT_EQ(longer.exit_code, 0) << longer.errors;
    const nlohmann::json deeper = nlohmann::json::parse(longer.output);
    EXPECT_EQ(deeper["simulations"], 32) << deeper;

    const std::string load = " --load " + dir.path() + "/ckpt";
    const std::vector<std::pair<std::string, std::string>> refused = {
        {"eval --config " MS_SOURCE_DIR "/tests/parallel/tiny.yaml" + load,
         "holds a self-play policy-value network (model.arch alphazero)"},
        {"eval --config " + kConfig + load + " --iters 2", "--iters applies to GPT-2 and Llama checkpoints only"},
        {"eval --config " + kConfig + load + " --set model.hidden_size=32",
         "has global shape [16,24] (vocabulary 0) in '" + dir.path() +
             "/ckpt/iter_0000003', but the network of the "
             "config"},
        // a network trained on the plain input does not load into one with threat features: the manifest says which
        {"eval --config " + kConfig + load + " --set selfplay.threat_features=true",
         "tensor 'trunk.embedding.weight' has global shape [16,24]"},
        {"eval --config " + kConfig + load + " --set selfplay.threat_features=true", "\"threat_features\":false"},
    };
    for (const auto& [command, words] : refused) {
        const CliResult r = run_cli(command);
        EXPECT_EQ(r.exit_code, 2) << command << "\n" << r.output;
        EXPECT_NE(r.output.find(words), std::string::npos) << command << "\n" << r.output;
    }
}

TEST(SelfPlay, BadConfigsAreRefusedWithASentence) {
    const TempDir dir("ms_selfplay");
    const std::string base = "selfplay --config " + kConfig + " --set run.output_dir=" + dir.path();
    const std::vector<std::pair<std::string, std::string>> cases = {
        {" --set selfplay.game=chess", "selfplay.game"},
        {" --set selfplay.game=chess", "connect4"},
        {" --set 'selfplay.curriculum=[\"5x6:8\", \"4x5:8\"]'", "stage 2 (4 x 5) does not grow from stage 1 (5 x 6)"},
        {" --set 'selfplay.curriculum=[\"4x5:8\", \"4x5:16\"]'", "does not grow"},
        {" --set 'selfplay.curriculum=[\"4x5\"]'", "is not a stage; write it as <rows>x<cols>:<simulations per move>"},
        {" --set 'selfplay.curriculum=[\"3x5:8\"]'", "selfplay.curriculum[0]"},
        {" --set selfplay.max_board=4x4", "the network cannot embed a 4 x 5 board"},
        {" --set 'selfplay.eval_opponents=[\"minimax\"]'", "unknown opponent 'minimax'"},
        {" --set selfplay.games_per_iteration=6", "must be a multiple of selfplay.games_per_group 4"},
        {" --set model.arch=gpt", "selfplay trains model.arch: alphazero"},
        {" --set selfplay.search=alphazero", "selfplay.search"},
    };
    for (const auto& [set, words] : cases) {
        const CliResult r = run_cli(base + set);
        EXPECT_EQ(r.exit_code, 2) << set << "\n" << r.output;
        EXPECT_NE(r.output.find(words), std::string::npos) << set << "\n" << r.output;
    }
    const CliResult train = run_cli("train --config " + kConfig + " --set run.output_dir=" + dir.path());
    EXPECT_EQ(train.exit_code, 2) << train.output;
    EXPECT_NE(train.output.find("run `mindspeed-train selfplay --config ...`"), std::string::npos) << train.output;
}

}  // namespace
}  // namespace ms::test
