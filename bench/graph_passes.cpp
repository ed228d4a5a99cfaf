// graph_passes.cpp: what the op graph's passes buy on GPT-2 124M shapes, measured side by side in one run.
//   build/graph_passes [micro_batch] [seq] [steps] [layers]      (default 4 1024 1 12; 2 threads: OMP_NUM_THREADS)
// 1. Fusion, by the graph's own byte accounting (engine/graph/report.h): bytes moved per transformer layer (forward
//    + backward) and by the LM head and loss, before and after the fusion pass, with and without the fused LM head.
// 2. Activation recomputation none / selective / full: the plan's activation bytes, what the arena holds after the
//    model is built (the same number, or the plan is wrong), the CPU time of a training step (forward + backward of
//    one micro-batch, after one untimed step), and whether the loss and every gradient are bit-identical to none.
// 3. The fused LM head: the same step with and without it, and the activation bytes each holds.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/self_communicator.h"
#include "engine/backends/backend.h"
#include "engine/core/philox.h"
#include "engine/graph/report.h"
#include "engine/model/gpt.h"
#include "engine/model/gpt_graph.h"
#include "memory/arena.h"

namespace {

using ms::graph::RecomputeGranularity;

double mib(double bytes) { return bytes / (1 << 20); }

struct StepResult {
    float loss = 0;
    std::vector<float> grads;
    double seconds = 0;
    size_t plan_bytes = 0, arena_bytes = 0;
};

StepResult run(const ms::GptShape& s, int B, int steps, const ms::GptGraphOptions& options,
               const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets) {
    ms::BackendOptions bo;
    std::unique_ptr<ms::Backend> backend = ms::make_backend(bo);
    ms::SelfCommunicator tp("tp");
    const ms::graph::MemoryPlan plan = ms::plan_gpt_memory(s, {}, 1, B, false, ms::DType::kF32, options);
    ms::Arena arena(plan.slot_bytes() + plan.scratch_bytes() + (size_t{3} << 30));
    ms::Gpt::Options o;
    o.max_batch = B;
    o.arena = &arena;
    o.graph = options;
    ms::Gpt model(s, *backend, tp, o);
    model.init_weights(1234);
    StepResult r;
    r.plan_bytes = plan.slot_bytes() + plan.scratch_bytes();
    r.arena_bytes = arena.live_bytes(ms::MemCategory::kActivation) + arena.live_bytes(ms::MemCategory::kWorkspace);
    for (int step = 0; step <= steps; ++step) {  // step 0 warms up (and compiles the programs)
        model.zero_grads();
        const auto start = std::chrono::steady_clock::now();
        r.loss = model.forward(tokens.data(), targets.data(), B, s.T, 0, 1.0f);
        model.backward(0);
        const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (step > 0) r.seconds += t / steps;
    }
    r.grads.assign(model.grads_f32(), model.grads_f32() + model.flat_size());
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    const int B = argc > 1 ? std::atoi(argv[1]) : 4;
    const int T = argc > 2 ? std::atoi(argv[2]) : 1024;
    const int steps = argc > 3 ? std::atoi(argv[3]) : 1;
    ms::GptShape s;  // GPT-2 124M
    s.L = argc > 4 ? std::atoi(argv[4]) : 12;
    s.T = T;
    std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<int32_t>(ms::philox_uniform_double(7, 0, i) * s.V) % s.V;
        targets[i] = static_cast<int32_t>(ms::philox_uniform_double(7, 1, i) * s.V) % s.V;
    }
    fmt::print(
        "graph_passes: GPT-2 124M shapes, {} layers, micro-batch {} x {} tokens, fp32, CPU backend, {} timed "
        "step(s)\n\n",
        s.L, B, T, steps);

    // 1. fusion by bytes
    fmt::print("1. bytes moved (read + written), the graph's own accounting\n");
    fmt::print("   {:<38} {:>12} {:>12} {:>8}\n", "", "unfused", "fused", "change");
    for (bool lm_head : {false, true}) {
        ms::GptGraphSpec spec{.shape = s, .B = B, .T = T, .fuse = false};
        spec.options.lm_head_loss_fusion = lm_head;
        const auto table = ms::gpt_param_table(s);
        const auto before = ms::graph::graph_totals(ms::build_gpt_graph(spec, table).g);
        spec.fuse = true;
        const auto after = ms::graph::graph_totals(ms::build_gpt_graph(spec, table).g);
        auto row = [&](const char* what, int64_t a, int64_t b) {
            fmt::print("   {:<38} {:>9.1f} MiB {:>9.1f} MiB {:>+7.1f}%\n", what, mib(a), mib(b),
                       100.0 * (static_cast<double>(b) - a) / a);
        };
        if (!lm_head) row("one layer, forward + backward", before.layer.moved(), after.layer.moved());
        row(lm_head ? "LM head + loss, with the fused LM head" : "LM head + loss, ops as written", before.head.moved(),
            after.head.moved());
    }

    // in place: gradients that alias another tensor's (identity gradients, the stage's received gradient) and
    // ops that write their input (the forward all-reduces, the cross-entropy backward over the logits)
    {
        const ms::GptGraphSpec spec{.shape = s, .B = B, .T = T};
        const ms::graph::Graph g = ms::build_gpt_graph(spec, ms::gpt_param_table(s)).g;
        std::vector<int> uses(g.tensors.size(), 0);
        for (size_t t = 0; t < g.tensors.size(); ++t) {
            const ms::graph::TensorId d = g.grad_of[t];
            if (d != ms::graph::kNoTensor && g.tensors[static_cast<size_t>(d)].role != ms::graph::Role::kGradient)
                ++uses[static_cast<size_t>(d)];
        }
        int aliased = 0;
        int64_t saved = 0;
        for (size_t t = 0; t < g.tensors.size(); ++t) {
            if (uses[t] <= 1) continue;
            aliased += uses[t] - 1;
            saved += (uses[t] - 1) * g.tensors[t].bytes();
        }
        int in_place = 0;
        for (const ms::graph::Node& n : g.nodes)
            for (ms::graph::TensorId t : n.out)
                if (t != ms::graph::kNoTensor && std::find(n.in.begin(), n.in.end(), t) != n.in.end()) ++in_place;
        fmt::print(
            "   in place: {} gradients alias another tensor's ({:.1f} MiB not allocated or copied); {} ops "
            "write their input\n",
            aliased, mib(static_cast<double>(saved)), in_place);
    }

    // 2. recomputation, 3. the fused LM head
    struct Case {
        const char* name;
        RecomputeGranularity granularity;
        bool lm_head;
    };
    const Case cases[] = {{"recompute none", RecomputeGranularity::kNone, false},
                          {"recompute selective", RecomputeGranularity::kSelective, false},
                          {"recompute full", RecomputeGranularity::kFull, false},
                          {"recompute none, fused LM head", RecomputeGranularity::kNone, true}};
    fmt::print("\n2./3. a training step (forward + backward of one micro-batch)\n");
    fmt::print("   {:<32} {:>14} {:>14} {:>10} {:>22}\n", "", "plan", "arena", "step", "vs none: loss, grads");
    StepResult none;
    for (const Case& c : cases) {
        ms::GptGraphOptions o;
        o.recompute.granularity = c.granularity;
        o.lm_head_loss_fusion = c.lm_head;
        const StepResult r = run(s, B, steps, o, tokens, targets);
        std::string same = "-";
        if (c.granularity == RecomputeGranularity::kNone && !c.lm_head) {
            none = r;
        } else {
            const bool loss = std::memcmp(&r.loss, &none.loss, sizeof r.loss) == 0;
            const bool grads = std::memcmp(r.grads.data(), none.grads.data(), r.grads.size() * sizeof(float)) == 0;
            double worst = 0, largest = 0;
            for (size_t i = 0; i < r.grads.size(); ++i) {
                worst = std::max(worst, static_cast<double>(std::abs(r.grads[i] - none.grads[i])));
                largest = std::max(largest, static_cast<double>(std::abs(none.grads[i])));
            }
            same = loss && grads
                       ? "bit-identical"
                       : fmt::format("{:.2g}, {:.2g}", std::abs(r.loss - none.loss) / none.loss, worst / largest);
        }
        fmt::print("   {:<32} {:>10.1f} MiB {:>10.1f} MiB {:>8.2f} s {:>22}\n", c.name, mib(r.plan_bytes),
                   mib(r.arena_bytes), r.seconds, same);
    }
    return 0;
}
