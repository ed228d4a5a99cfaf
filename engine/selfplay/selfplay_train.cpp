// selfplay_train.cpp: the self-play training loop (selfplay_train.h).
#include "engine/selfplay/selfplay_train.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "comm/bootstrap.h"
#include "comm/process_groups.h"
#include "engine/backends/backend.h"
#include "engine/ckpt/atomic_dir.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/core/timer.h"
#include "engine/model/policy_value.h"
#include "engine/optim/adamw.h"
#include "engine/optim/distributed_optimizer.h"
#include "engine/selfplay/policy_value_net.h"
#include "engine/selfplay/replay_buffer.h"
#include "engine/selfplay/selfplay_eval.h"
#include "engine/selfplay/selfplay_layout.h"
#include "engine/train/metrics_log.h"
#include "engine/train/train_setup.h"

namespace ms::selfplay {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The data identity of train_state.json: self-play generates its data, so the game and the seed are all there is.
std::string data_id(const Config& cfg) { return fmt::format("selfplay:{}:seed{}", cfg.selfplay.game, cfg.run.seed); }

// The stats of every rank's games: each rank's summed over `dp`.
SelfPlayStats sum_over_ranks(Communicator& dp, const SelfPlayStats& mine) {
    std::array<int32_t, 8> counts = {static_cast<int32_t>(mine.games),
                                     static_cast<int32_t>(mine.moves),
                                     static_cast<int32_t>(mine.positions),
                                     static_cast<int32_t>(mine.first_player_wins),
                                     static_cast<int32_t>(mine.second_player_wins),
                                     static_cast<int32_t>(mine.draws),
                                     static_cast<int32_t>(mine.positions_evaluated),
                                     static_cast<int32_t>(mine.evaluate_calls)};
    dp.all_reduce(std::span<int32_t>(counts), ReduceOp::kSum).wait();
    SelfPlayStats all;
    all += SelfPlayStats{.games = counts[0],
                         .moves = counts[1],
                         .positions = counts[2],
                         .first_player_wins = counts[3],
                         .second_player_wins = counts[4],
                         .draws = counts[5],
                         .positions_evaluated = counts[6],
                         .evaluate_calls = counts[7]};
    return all;
}

struct Checkpoints {
    std::unique_ptr<SaveDirLock> save_lock;
    std::optional<TrainState> resumed;
};

}  // namespace

int run_selfplay(const Config& cfg) {
    const double t_start = now_seconds();
    MpiRuntime mpi;
    Communicator& world = mpi.world();
    const SelfPlayLayout l = selfplay_layout(cfg, world.size());
    ProcessGroups groups = make_process_groups(world, Topology{.tp = l.tp, .dp = l.dp, .pp = 1});
    BackendOptions bo;
    bo.num_threads = cfg.run.num_threads;
    bo.local_rank = mpi.local_rank();
    bo.local_size = mpi.local_size();
    std::unique_ptr<Backend> backend = make_backend(bo);
    const SelfPlayConfig& c = cfg.selfplay;
    PolicyValueNet net(l.shape, *backend, groups, l.max_batch);
    net.init_weights(cfg.run.seed, cfg.model.init_method_std);
    DistributedOptimizer optimizer(net.params_info(), net.flat_size(), net.params(), net.grads(), cfg.optimizer,
                                   cfg.parallel.zero_stage, *backend, *groups.dp, *groups.mp, groups.tp_rank);
    log_selfplay_layout(cfg, l);

    int stage = 0;
    ReplayBuffer buffer(l.stages[0].rows, l.stages[0].cols, c.replay_capacity);
    CheckpointContext ckpt{.cfg = cfg,
                           .model = selfplay_checkpoint_model(l.shape),
                           .groups = groups,
                           .params_info = net.params_info(),
                           .params = net.params(),
                           .optimizer = optimizer};
    ckpt.write_extra = [&](const std::string& dir) {
        buffer.save(dir + "/" + kReplayFile);
        write_file_atomic(dir + "/" + kStateFile, json{{"stage", stage}, {"game", c.game}}.dump(2) + "\n");
    };
    Checkpoints checkpoints;
    on_every_rank_or_none(world, "use checkpoint.save", [&] { checkpoints.save_lock = open_save_dir(ckpt); });
    checkpoints.resumed = load_checkpoint(ckpt, data_id(cfg));
    const std::optional<TrainState>& resumed = checkpoints.resumed;
    on_every_rank_or_none(world, "use checkpoint.save",
                          [&] { check_no_newer_checkpoint(ckpt, resumed ? resumed->iteration : 0); });
    if (resumed) {
        const std::string dir = (fs::path(cfg.checkpoint.load) / checkpoint_dir_name(resumed->iteration)).string();
        on_every_rank_or_none(world, "read the checkpoint's self-play state", [&] {
            stage = read_checkpoint_stage(dir, static_cast<int>(l.stages.size()));
            buffer = ReplayBuffer::load(dir + "/" + kReplayFile);
            const Stage& s = l.stages[static_cast<size_t>(stage)];
            if (buffer.rows() != s.rows || buffer.cols() != s.cols || buffer.capacity() != c.replay_capacity)
                throw UserError(fmt::format(
                    "the checkpoint's replay buffer holds {} x {} positions up to {}, but stage "
                    "{} of selfplay.curriculum is {} x {} and selfplay.replay_capacity is {}",
                    buffer.rows(), buffer.cols(), buffer.capacity(), stage + 1, s.rows, s.cols, c.replay_capacity));
        });
        log_info("selfplay: resumed at iteration {}, curriculum stage {} ({}), {} positions in the replay buffer",
                 resumed->iteration, stage + 1, l.stages[static_cast<size_t>(stage)].name(), buffer.size());
    }

    const bool writer = world.rank() == 0;
    std::ofstream metrics;
    if (writer && !cfg.logging.metrics_file.empty())
        metrics = open_metrics_log(cfg.logging.metrics_file,
                                   resumed ? std::optional<int64_t>(resumed->iteration) : std::nullopt);
    const int64_t iters = cfg.training.train_iters, total_steps = iters * c.train_steps;
    const int64_t first_it = resumed ? resumed->iteration + 1 : 1;
    ReplayBatch batch;
    for (int64_t it = first_it; it <= iters; ++it) {
        const Stage& s = l.stages[static_cast<size_t>(stage)];
        // self-play: this rank's groups, games numbered over the whole run
        const double t0 = now_seconds();
        const SelfPlayOptions options = l.play_options(cfg, stage);
        std::vector<TrainingPosition<games::Connect4>> mine;
        SelfPlayStats stats;
        for (int g = 0; g < l.groups_per_rank; ++g) {
            const uint64_t first_game =
                static_cast<uint64_t>((it - 1) * c.games_per_iteration +
                                      (int64_t{groups.dp_rank} * l.groups_per_rank + g) * c.games_per_group);
            SelfPlayGames played =
                play_games(net, s.rows, s.cols, options, cfg.run.seed, first_game, c.games_per_group);
            mine.insert(mine.end(), played.positions.begin(), played.positions.end());
            stats += played.stats;
        }
        buffer.add_from_all_ranks(*groups.dp, mine);
        const double t_play = now_seconds() - t0;
        stats = sum_over_ranks(*groups.dp, stats);  // the logged counts: every rank's games

        // learning: steps numbered over the whole run, each rank its slice of the step's global batch
        PolicyValueLoss loss;
        double grad_norm = 0;
        for (int k = 0; k < c.train_steps; ++k) {
            const int64_t step = (it - 1) * c.train_steps + k + 1;
            buffer.fill_batch(buffer.sample_slice(cfg.run.seed, step, int64_t{groups.dp_rank} * l.b, l.b), batch);
            loss = net.train_step(batch.states, batch.policies, batch.outcomes);
            const float lr = learning_rate(cfg.optimizer, cfg.lr_schedule, total_steps, step);
            const OptimizerStepResult r = optimizer.step(lr, cfg.training.clip_grad);
            if (!std::isfinite(loss.loss) || !r.stepped)
                throw RunError(
                    fmt::format("iteration {}, step {}: the loss ({}) or the gradient norm ({}) is not finite", it,
                                step, loss.loss, r.grad_norm),
                    kExitNumerical);
            grad_norm = r.grad_norm;
        }
        // the logged loss: the mean over dp of the last step's
        float logged[3] = {loss.loss, loss.policy_loss, loss.value_loss};
        groups.dp->all_reduce(std::span<float>(logged), ReduceOp::kSum).wait();
        for (float& v : logged) v /= static_cast<float>(l.dp);
        const double t_iter = now_seconds() - t0;
        log_info(
            " iteration {:>5}/{:>5} | stage {} ({} x {}) | {} games, {} moves, {} positions, buffer {} | first "
            "player won {}, drew {} | loss {:.4f} (policy {:.4f}, value {:.4f}) | grad norm {:.3f} | {:.0f} "
            "positions evaluated/s over the ranks | {:.1f} s (play {:.1f} s)",
            it, iters, stage + 1, s.rows, s.cols, stats.games, stats.moves, stats.positions, buffer.size(),
            stats.first_player_wins, stats.draws, logged[0], logged[1], logged[2], grad_norm,
            static_cast<double>(stats.positions_evaluated) / t_play, t_iter, t_play);
        if (writer && metrics.is_open())
            metrics << json{{"iteration", it},
                            {"stage", stage + 1},
                            {"board", fmt::format("{}x{}", s.rows, s.cols)},
                            {"loss", logged[0]},
                            {"policy loss", logged[1]},
                            {"value loss", logged[2]},
                            {"grad-norm", grad_norm},
                            {"games", stats.games},
                            {"moves", stats.moves},
                            {"positions", stats.positions},
                            {"replay positions", buffer.size()},
                            {"first player wins", stats.first_player_wins},
                            {"draws", stats.draws},
                            {"positions evaluated per second", static_cast<double>(stats.positions_evaluated) / t_play},
                            {"seconds", t_iter}}
                           .dump()
                    << std::endl;  // flushed: a watcher (report, a plot) sees each iteration as it ends

        if ((c.eval_interval > 0 && it % c.eval_interval == 0) || it == iters) {
            const double te = now_seconds();
            const std::vector<Evaluation> evals = evaluate(cfg, l, groups, s, net, it, it == iters);
            json record = log_evaluations(evals, fmt::format(" iteration {:>5}/{:>5} |", it, iters), it, stage, s,
                                          l.eval_options(cfg, it == iters).simulations);
            double promote_score = -1;
            for (const Evaluation& e : evals)
                if (e.opponent == l.promote_against.spec) promote_score = e.score();
            record["seconds"] = now_seconds() - te;
            if (writer && metrics.is_open()) metrics << record.dump() << std::endl;
            if (stage + 1 < static_cast<int>(l.stages.size()) && promote_score >= c.promote_score) {
                ++stage;
                const Stage& next = l.stages[static_cast<size_t>(stage)];
                buffer.clear_for(next.rows, next.cols);
                log_info("selfplay: curriculum stage {} ({}) after scoring {:.3f} against {} on {} x {}", stage + 1,
                         next.name(), promote_score, l.promote_against.spec, s.rows, s.cols);
            }
        }
        if (!cfg.checkpoint.save.empty() &&
            ((cfg.checkpoint.save_interval > 0 && it % cfg.checkpoint.save_interval == 0) || it == iters)) {
            if (metrics.is_open()) metrics.flush();
            TrainState t;
            t.iteration = it;
            t.consumed_samples = buffer.total_added();
            t.last_lr = learning_rate(cfg.optimizer, cfg.lr_schedule, total_steps, it * c.train_steps);
            t.seed = cfg.run.seed;
            t.optimizer_steps_per_iteration = std::max(c.train_steps, 1);
            t.data_fingerprint = data_id(cfg);
            t.data_describe = "self-play games";
            save_checkpoint(ckpt, t);
        }
    }
    log_info("done: {} iterations in {:.1f} s; metrics in {}", iters, now_seconds() - t_start,
             cfg.logging.metrics_file);
    return kExitOk;
}

}  // namespace ms::selfplay
