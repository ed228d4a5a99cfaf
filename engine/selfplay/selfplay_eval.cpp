// selfplay_eval.cpp: evaluation matches, the self-play checkpoint's own files, and `eval` of a self-play checkpoint
// (selfplay_eval.h).
#include "engine/selfplay/selfplay_eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <memory>

#include "comm/self_communicator.h"
#include "engine/backends/backend.h"
#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/core/philox.h"
#include "engine/core/timer.h"
#include "engine/model/policy_value.h"

namespace ms::selfplay {
namespace {

using nlohmann::json;

// The evaluation matches' seeds: a stream of their own per iteration.
uint64_t eval_seed(const Config& cfg, int64_t it) { return name_hash("selfplay evaluation") ^ (cfg.run.seed + it); }

// The games of an evaluation match that data-parallel rank `rank` of `ranks` plays: whole pairs (one opening with
// each colour), the pairs split as evenly as they go.
GameRange share_of(int games, int rank, int ranks) {
    const int pairs = (games + 1) / 2;
    return {std::min(games, 2 * (pairs * rank / ranks)), std::min(games, 2 * (pairs * (rank + 1) / ranks))};
}

// The whole match from every rank's share of it (share_of): the tallies summed, the games' moves gathered in game
// order for the distinct count. `search` stays this rank's own.
MatchResult gather_match(Communicator& dp, const MatchResult& mine, int games, int cells) {
    const int ranks = dp.size();
    std::array<int32_t, 6> tallies = {mine.as_first.wins,  mine.as_first.draws,  mine.as_first.losses,
                                      mine.as_second.wins, mine.as_second.draws, mine.as_second.losses};
    dp.all_reduce(std::span<int32_t>(tallies), ReduceOp::kSum).wait();
    MatchResult all;
    all.as_first = {tallies[0], tallies[1], tallies[2]};
    all.as_second = {tallies[3], tallies[4], tallies[5]};
    all.total = all.as_first + all.as_second;
    all.search = mine.search;
    // Each rank's games as columns + 1, a game per `cells` slots, 0 after its last move.
    int slot_games = 0;  // the largest share
    for (int r = 0; r < ranks; ++r) {
        const GameRange share = share_of(games, r, ranks);
        slot_games = std::max(slot_games, share.end - share.begin);
    }
    std::vector<int32_t> slot(static_cast<size_t>(slot_games) * cells, 0), gathered(slot.size() * ranks);
    for (size_t g = 0; g < mine.moves.size(); ++g)
        for (size_t m = 0; m < mine.moves[g].size(); ++m) slot[g * cells + m] = mine.moves[g][m] - '0';
    dp.all_gather(std::span<const int32_t>(slot), std::span<int32_t>(gathered)).wait();
    for (int r = 0; r < ranks; ++r) {
        const GameRange share = share_of(games, r, ranks);
        for (int g = 0; g < share.end - share.begin; ++g) {
            std::string moves;
            for (int m = 0; m < cells; ++m) {
                const int32_t column = gathered[(static_cast<size_t>(r) * slot_games + g) * cells + m];
                if (column == 0) break;
                moves += static_cast<char>('0' + column);
            }
            all.moves.push_back(std::move(moves));
        }
    }
    all.distinct_games = count_distinct(all.moves);
    return all;
}

}  // namespace

CheckpointModel selfplay_checkpoint_model(const GptShape& shape) {
    return CheckpointModel{.whole_table = policy_value_param_table(shape, 1),
                           .manifest = {{"arch", "alphazero"},
                                        {"num_layers", shape.L},
                                        {"hidden_size", shape.C},
                                        {"num_attention_heads", shape.NH},
                                        {"ffn_hidden_size", shape.F},
                                        {"board_rows", shape.board_rows},
                                        {"board_cols", shape.board_cols},
                                        {"threat_features", shape.threat_features},
                                        {"vocab_size", 0}},
                           .vocab_size = 0};
}

int read_checkpoint_stage(const std::string& dir, int stages) {
    const std::string path = dir + "/" + kStateFile;
    std::ifstream in(path);
    if (!in)
        throw UserError(
            fmt::format("checkpoint '{}' holds no {}: it was not saved by `mindspeed-train selfplay`; "
                        "hint: point checkpoint.load (or eval's --load) at a self-play run's checkpoints",
                        dir, kStateFile));
    const json j = json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("stage") || !j["stage"].is_number_integer())
        throw UserError(fmt::format("'{}' is not a self-play state (a JSON object with \"stage\")", path));
    const int stage = j["stage"].get<int>();
    if (stage < 0 || stage >= stages)
        throw UserError(fmt::format("'{}' is at curriculum stage {}, but selfplay.curriculum has {} stages", path,
                                    stage + 1, stages));
    return stage;
}

double Evaluation::score() const {
    const Tally& t = match.total;
    return (t.wins + 0.5 * t.draws) / static_cast<double>(t.games());
}

std::vector<Evaluation> evaluate(const Config& cfg, const SelfPlayLayout& l, const ProcessGroups& groups,
                                 const Stage& stage, PolicyValueNet& net, int64_t it, bool final) {
    std::vector<Opponent> opponents = l.eval_opponents;
    bool has_promote = false;
    for (const Opponent& o : opponents) has_promote |= o.spec == l.promote_against.spec;
    if (!has_promote && l.stages.size() > 1) opponents.push_back(l.promote_against);
    std::vector<Evaluation> out;
    const Player agent = Player::agent(net, l.eval_options(cfg, final));
    const int games = l.eval_games(cfg, final);
    const GameRange share = share_of(games, groups.dp_rank, groups.dp->size());
    for (const Opponent& o : opponents) {
        const MatchResult mine = play_match(agent, o.player, stage.rows, stage.cols, games, eval_seed(cfg, it),
                                            cfg.selfplay.eval_opening_moves, share);
        out.push_back({o.spec, gather_match(*groups.dp, mine, games, stage.rows * stage.cols)});
    }
    return out;
}

json log_evaluations(const std::vector<Evaluation>& evals, const std::string& prefix, int64_t it, int stage_index,
                     const Stage& stage, int simulations) {
    json record = {{"iteration", it},
                   {"stage", stage_index + 1},
                   {"board", fmt::format("{}x{}", stage.rows, stage.cols)},
                   {"simulations", simulations}};
    for (const Evaluation& e : evals) {
        const Tally& t = e.match.total;
        log_info(
            "{} evaluation on {} x {} vs {}: won {}, drew {}, lost {} of {} (score {:.3f}; first {}/{}, second {}/{} "
            "won; {} distinct games)",
            prefix, stage.rows, stage.cols, e.opponent, t.wins, t.draws, t.losses, t.games(), e.score(),
            e.match.as_first.wins, e.match.as_first.games(), e.match.as_second.wins, e.match.as_second.games(),
            e.match.distinct_games);
        record["vs " + e.opponent] = {{"wins", t.wins},     {"draws", t.draws},
                                      {"losses", t.losses}, {"win rate", static_cast<double>(t.wins) / t.games()},
                                      {"score", e.score()}, {"distinct games", e.match.distinct_games}};
    }
    return record;
}

json run_selfplay_eval(Config cfg, const CheckpointReader& reader, const std::string& config_name) {
    cfg.parallel = ParallelConfig{};  // one rank, the whole network
    const SelfPlayLayout l = selfplay_layout(cfg, 1);
    check_checkpoint_shape(reader, selfplay_checkpoint_model(l.shape), "the network of the config " + config_name,
                           "make model.* and the curriculum's largest board match it, or pass a checkpoint of the "
                           "network the config describes");
    const int stage_index = read_checkpoint_stage(reader.dir(), static_cast<int>(l.stages.size()));
    const Stage& stage = l.stages[static_cast<size_t>(stage_index)];
    const int simulations = l.eval_options(cfg, true).simulations;
    log_info(
        "eval: {} (iteration {}), curriculum stage {} ({} x {}): {} games against each opponent, the agent "
        "searching {} simulations per move",
        reader.dir(), reader.iteration(), stage_index + 1, stage.rows, stage.cols, l.eval_games(cfg, true),
        simulations);

    BackendOptions bo;  // the CPU backend: `eval` is a single-process tool
    bo.num_threads = cfg.run.num_threads;
    const std::unique_ptr<Backend> backend = make_backend(bo);
    SelfCommunicator world("world");
    const ProcessGroups groups = make_process_groups(world, Topology{});
    PolicyValueNet net(l.shape, *backend, groups, l.max_batch);
    for (const ParamInfo& p : net.params_info())  // tp 1: each parameter is its whole canonical tensor
        reader.read_box(p.name, std::nullopt, shard_box(p, 0, 1), 0, p.numel, net.params() + p.offset);

    const double t0 = now_seconds();
    const std::vector<Evaluation> evals = evaluate(cfg, l, groups, stage, net, reader.iteration(), true);
    json record = log_evaluations(evals, fmt::format("eval: iteration {} |", reader.iteration()), reader.iteration(),
                                  stage_index, stage, simulations);
    record["seconds"] = now_seconds() - t0;
    record["checkpoint"] = reader.dir();
    return record;
}

}  // namespace ms::selfplay
