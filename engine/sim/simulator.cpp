// simulator.cpp: simulate_stages() (simulator.h); step_inputs() is in step_inputs.cpp.
#include "engine/sim/simulator.h"

#include <algorithm>

#include <fmt/format.h>

#include "engine/core/check.h"
#include "engine/optim/grad_buckets.h"
#include "engine/parallel/schedule.h"

namespace ms::sim {
namespace {

using Kind = Action::Kind;
constexpr double kNoEvent = 1e300;

// What the schedule's run left per stage: clocks and the start times step 4 and 6 need.
struct PipelineRun {
    std::vector<double> end, busy, p2p;
    std::vector<std::vector<double>> last_backward_start;  // (pp, v) of the last micro-batch's backward
    std::vector<std::vector<double>> first_forward_start;  // (pp, v) of micro-batch 0's forward
};

// Runs every stage's action list from its own start (simulator.h, step 2). Deadlock-free for the schedules
// make_schedule() gives (check_in_order_p2p proves it); fatal otherwise.
//
// The stages' forwards and backwards share `cores` (step 7: pp / the host's oversubscription; pp or more: each stage
// has a core of its own): at any moment the k computing stages progress at min(1, cores / k) of their own speed, so
// a stage waiting in the bubble leaves its share to the others. Events are taken in time order: a compute starts
// when its stage reaches it, and the earliest of the running ones to finish ends next. Point-to-point batches take
// no core.
PipelineRun run_pipeline(const StepInputs& in, const std::vector<double>& start, double cores) {
    const int pp = static_cast<int>(in.stages.size()), v = in.virtual_stages, m = in.microbatches;
    const auto schedule = make_schedule(in.schedule, pp, m, v);
    const int num_chunks = pp * v;
    // one mailbox per message: (activation | grad, micro-batch, producing model chunk) -> when it was posted
    std::vector<double> posted(2 * static_cast<size_t>(m) * num_chunks, -1.0);
    const auto slot = [&](bool grad, int mb, int producer) -> double& {
        return posted[(static_cast<size_t>(grad) * m + mb) * num_chunks + producer];
    };

    PipelineRun r;
    r.end = start;
    r.busy.assign(pp, 0.0);
    r.p2p.assign(pp, 0.0);
    r.last_backward_start.assign(pp, std::vector<double>(v, 0.0));
    r.first_forward_start.assign(pp, std::vector<double>(v, 0.0));
    std::vector<size_t> pc(pp, 0);
    std::vector<double> batch_start(pp, -1.0), batch_end(pp, 0.0);  // batch_start < 0: no batch open
    // the compute each stage is at: its work left (seconds at full speed), or < 0 when it is at none
    std::vector<double> left(pp, -1.0);
    // Moves stage s through its point-to-point actions as far as the posted messages allow, up to its next compute
    // (whose work it sets, to start at r.end[s]).
    const auto advance = [&](int s) {
        const std::vector<Action>& actions = schedule[s];
        double& clock = r.end[s];
        for (; pc[s] < actions.size(); ++pc[s]) {
            const Action& a = actions[pc[s]];
            const int k = a.chunk * pp + s;
            if (a.kind == Kind::kForward || a.kind == Kind::kBackward) {
                const bool fwd = a.kind == Kind::kForward;
                if (fwd && a.microbatch == 0) r.first_forward_start[s][a.chunk] = clock;
                if (!fwd && a.microbatch == m - 1) r.last_backward_start[s][a.chunk] = clock;
                const ChunkCost& c = in.stages[s].chunks[a.chunk];
                left[s] = fwd ? c.forward : c.backward;
                r.busy[s] += left[s];
                return;
            }
            if (batch_start[s] < 0) {  // open the batch: post every send of it now
                batch_start[s] = batch_end[s] = clock;
                for (size_t j = pc[s];; ++j) {
                    const Action& b = actions[j];
                    if (b.kind == Kind::kSendActivation || b.kind == Kind::kSendGrad) {
                        const int kb = b.chunk * pp + s;
                        slot(b.kind == Kind::kSendGrad, b.microbatch, kb) = clock;
                        const double t = in.p2p_seconds[s][b.peer_stage];
                        batch_end[s] = std::max(batch_end[s], clock + t);
                        r.p2p[s] += t;
                    }
                    if (ends_p2p_batch(actions, j)) break;
                }
            }
            if (a.kind == Kind::kRecvActivation || a.kind == Kind::kRecvGrad) {
                const bool grad = a.kind == Kind::kRecvGrad;
                const double sent = slot(grad, a.microbatch, grad ? k + 1 : k - 1);
                if (sent < 0) return;  // not posted yet: come back once the other stages moved
                batch_end[s] = std::max(batch_end[s], std::max(sent, batch_start[s]) + in.p2p_seconds[a.peer_stage][s]);
            }
            if (ends_p2p_batch(actions, pc[s])) {
                clock = batch_end[s];
                batch_start[s] = -1.0;
            }
        }
    };
    double now = *std::min_element(start.begin(), start.end());
    for (;;) {
        for (bool moved = true; moved;) {  // a batch one stage opens may let another's receive through
            moved = false;
            for (int s = 0; s < pp; ++s) {
                if (left[s] >= 0) continue;
                const size_t was = pc[s];
                advance(s);
                moved = moved || pc[s] != was || left[s] >= 0;
            }
        }
        // the stages computing now, and the next event: a compute starting, or the first running one finishing
        int running = 0;
        double next_start = kNoEvent;
        for (int s = 0; s < pp; ++s) {
            if (left[s] < 0) continue;
            if (r.end[s] <= now)
                ++running;
            else
                next_start = std::min(next_start, r.end[s]);
        }
        if (running == 0 && next_start == kNoEvent) break;  // every stage done, or waiting forever
        const double rate = std::min(1.0, cores / std::max(running, 1));
        double next_end = kNoEvent;
        for (int s = 0; s < pp; ++s)
            if (left[s] >= 0 && r.end[s] <= now) next_end = std::min(next_end, now + left[s] / rate);
        const double next = std::min(next_start, next_end);
        for (int s = 0; s < pp; ++s) {
            if (left[s] < 0 || r.end[s] > now) continue;
            r.end[s] = next;
            if (now + left[s] / rate <= next) {  // done: the stage goes on from here
                left[s] = -1.0;
                ++pc[s];
            } else {
                left[s] -= (next - now) * rate;
            }
        }
        now = next;
    }
    for (int s = 0; s < pp; ++s)
        MS_CHECK(pc[s] == schedule[s].size(), "simulator: stage {} waits forever at action {} of {}", s, pc[s],
                 to_string(schedule[s][pc[s]]));
    return r;
}

// When the gradients of [begin, end) are all final: the latest of its entries' times (each from its chunk's start),
// and deferred_ready for a deferred one.
double grads_ready(int64_t begin, int64_t end, const StageInput& st, const std::vector<double>& chunk_start,
                   double deferred_ready) {
    double t = 0;
    for (size_t c = 0; c < st.chunks.size(); ++c)
        for (const RangeAt& r : st.chunks[c].grads_final)
            if (r.end > begin && r.begin < end) t = std::max(t, chunk_start[c] + r.at);
    for (const auto& [b, e] : st.deferred)
        if (e > begin && b < end) t = std::max(t, deferred_ready);
    return t;
}

// When a parameter of [begin, end) is first read: the earliest of its entries' times; never read in the forward
// (kNever): only the next optimizer step waits for it.
constexpr double kNever = 1e300;
double params_needed(int64_t begin, int64_t end, const StageInput& st, const std::vector<double>& chunk_start) {
    double t = kNever;
    for (size_t c = 0; c < st.chunks.size(); ++c)
        for (const RangeAt& r : st.chunks[c].params_read)
            if (r.end > begin && r.begin < end) t = std::min(t, chunk_start[c] + r.at);
    return t;
}

// Elements of [begin, end) in each dp shard it meets: the owner parts of GradBuckets and ParamGather.
std::vector<int64_t> owner_part_sizes(int64_t begin, int64_t end, int64_t shard) {
    std::vector<int64_t> parts;
    for (int64_t b = begin; b < end;) {
        const int64_t e = std::min(end, (b / shard + 1) * shard);
        parts.push_back(e - b);
        b = e;
    }
    return parts;
}

// Seconds of one bucket's reduction or gather: one collective, or one per owner part (zero_stage 1).
double bucket_seconds(const DpCosts& dp, const Affine& f, int64_t begin, int64_t end, int64_t padded,
                      double bytes_per_elem) {
    if (dp.zero_stage == 0) return f(static_cast<double>(end - begin) * bytes_per_elem);
    double t = 0;
    for (int64_t n : owner_part_sizes(begin, end, padded / dp.size)) t += f(static_cast<double>(n) * bytes_per_elem);
    return t;
}

}  // namespace

namespace {

// Step 4 on stage s, whose backward (and tied-embedding sum) ends at `end`: the end of its gradient reduction.
double reduce_gradients(const StepInputs& in, const PipelineRun& run, int s, double end, StageResult& r) {
    const StageInput& st = in.stages[s];
    const DpCosts& dp = in.dp;
    if (dp.size <= 1) return end;
    if (dp.bucket_elems <= 0) {
        r.dp_total = dp.reduce_whole(static_cast<double>(st.padded) * dp.grad_bytes_per_elem);
        r.dp_exposed = r.dp_total;
        return end + r.dp_total;
    }
    struct Ready {
        double at;
        int64_t begin, end;
    };
    std::vector<Ready> ready;
    for (const auto& [b, e] : bucket_ranges(st.params, st.padded, dp.bucket_elems))
        ready.push_back({grads_ready(b, e, st, run.last_backward_start[s], end), b, e});
    std::stable_sort(ready.begin(), ready.end(), [](const Ready& a, const Ready& b) { return a.at < b.at; });
    double link_free = 0;
    if (dp.zero_stage == 2) {
        // every earlier micro-batch reduces its buckets too (sharded_grads.h): counted on the link from the step's
        // start, so hidden behind the pipeline wherever they fit before the last micro-batch's buckets
        double one = 0;
        for (const Ready& b : ready)
            one += bucket_seconds(dp, dp.reduce_bucket, b.begin, b.end, st.padded, dp.grad_bytes_per_elem);
        link_free = (in.microbatches - 1) * one;
        r.dp_total += link_free;
    }
    for (const Ready& b : ready) {
        const double t = bucket_seconds(dp, dp.reduce_bucket, b.begin, b.end, st.padded, dp.grad_bytes_per_elem);
        link_free = std::max(link_free, b.at) + t;
        r.dp_total += t;
    }
    r.buckets = static_cast<int>(ready.size());
    r.dp_exposed = std::max(0.0, link_free - end);
    return end + r.dp_exposed;
}

// Step 6's gather on stage s: its seconds after the optimizer (whole), or with overlap_param_gather the lateness
// of its buckets against the first forward's reads (returned through r.gather_exposed; 0 here).
double gather_params(const StepInputs& in, const PipelineRun& run, int s, StageResult& r) {
    const StageInput& st = in.stages[s];
    const DpCosts& dp = in.dp;
    if (dp.size <= 1 || dp.zero_stage == 0) return 0;
    if (!dp.param_gather_overlap || dp.bucket_elems <= 0) {
        r.gather_total = r.gather_exposed = dp.gather_whole(static_cast<double>(st.padded) * dp.param_bytes_per_elem);
        return r.gather_total;
    }
    // issued from the buffer's start after the update; the next step's forwards read them on the clocks of this
    // step's first forwards (a wait shifts everything after it, so the largest lateness is what is exposed)
    auto buckets = bucket_ranges(st.params, st.padded, dp.bucket_elems);
    std::reverse(buckets.begin(), buckets.end());
    double link_free = 0;
    for (const auto& [b, e] : buckets) {
        const double g = bucket_seconds(dp, dp.gather_part, b, e, st.padded, dp.param_bytes_per_elem);
        link_free += g;
        r.gather_total += g;
        r.gather_exposed = std::max(r.gather_exposed, link_free - params_needed(b, e, st, run.first_forward_start[s]));
    }
    return 0;
}

}  // namespace

SimulatedStep simulate_stages(const StepInputs& in) {
    const int pp = static_cast<int>(in.stages.size());
    MS_CHECK(pp >= 1 && in.p2p_seconds.size() == static_cast<size_t>(pp), "simulator: {} stages, {} p2p rows", pp,
             in.p2p_seconds.size());
    SimulatedStep out;
    out.stages.resize(pp);
    std::vector<double> start(pp);
    for (int s = 0; s < pp; ++s) {
        out.stages[s].zero = start[s] = in.stages[s].zero_seconds;  // 1.
        out.stages[s].optimizer = in.stages[s].optimizer_seconds;
        out.stages[s].memory_bytes = in.stages[s].memory_bytes;
    }

    // 2. the schedule
    const PipelineRun run = run_pipeline(in, start, pp / std::max(1.0, in.oversubscription));
    double busy_sum = 0;
    for (int s = 0; s < pp; ++s) {
        StageResult& r = out.stages[s];
        r.pipeline_end = run.end[s];
        r.busy = run.busy[s];
        r.p2p = run.p2p[s];
        for (const ChunkCost& c : in.stages[s].chunks)
            r.tp_comm += in.microbatches * (c.forward_comm + c.backward_comm);
        out.pipeline_seconds = std::max(out.pipeline_seconds, run.end[s] - start[s]);
        busy_sum += run.busy[s];
    }
    out.bubble_fraction = out.pipeline_seconds > 0 ? std::max(0.0, 1.0 - busy_sum / pp / out.pipeline_seconds) : 0.0;

    // 3. the tied embedding between the first and the last stage
    std::vector<double> end = run.end;
    if (pp > 1 && in.stages[0].embd_seconds > 0) {
        const double t = std::max(end[0], end[pp - 1]) + in.stages[0].embd_seconds;
        out.stages[0].embd = out.stages[pp - 1].embd = in.stages[0].embd_seconds;
        end[0] = end[pp - 1] = t;
    }

    // 4. the gradient reduction; 5. the scalars, which every stage waits for
    double synced = 0;
    for (int s = 0; s < pp; ++s) synced = std::max(synced, reduce_gradients(in, run, s, end[s], out.stages[s]));
    out.scalar_seconds = in.scalar_seconds;
    synced += in.scalar_seconds;

    // 6. the optimizer and zero_stage 1's gather
    double gather_late = 0;
    for (int s = 0; s < pp; ++s) {
        StageResult& r = out.stages[s];
        const double t = synced + in.stages[s].optimizer_seconds + gather_params(in, run, s, r);
        out.step_seconds = std::max(out.step_seconds, t);
        if (in.dp.param_gather_overlap && in.dp.bucket_elems > 0) gather_late = std::max(gather_late, r.gather_exposed);
    }
    out.step_seconds += gather_late;

    double compute = 0;
    for (const StageResult& r : out.stages) {
        out.comm_total_seconds += (r.comm_total() + in.scalar_seconds) / pp;
        out.comm_exposed_seconds += (r.comm_exposed() + in.scalar_seconds) / pp;
        compute += (r.busy - r.tp_comm + r.zero + r.optimizer) / pp;
    }

    // 7. an oversubscribed host: its cores run every rank's compute and its shared-memory transfers
    out.shared_cores_seconds = out.step_seconds;
    out.oversubscription = in.oversubscription;
    out.host_compute_seconds = compute;
    if (in.oversubscription > 1) {
        out.host_bound_seconds = in.oversubscription * (compute + out.comm_exposed_seconds);
        out.step_seconds = std::max(out.step_seconds, out.host_bound_seconds);
    }
    out.tokens_per_s = out.step_seconds > 0 ? in.tokens_per_step / out.step_seconds : 0;
    out.mfu = in.peak_flops > 0 ? in.flops_per_token * out.tokens_per_s / (in.peak_flops * in.world_size) : 0;
    return out;
}

std::vector<std::string> step_report(const SimulatedStep& step, const RunLayout& layout) {
    const auto ms = [](double s) { return fmt::format("{:.2f}", 1e3 * s); };
    const auto pct = [](double f) { return fmt::format("{:.1f}%", 100.0 * f); };
    std::vector<std::string> lines = {
        fmt::format("  step {} ms: {:.0f} tokens/s, MFU {} over {} rank(s)", ms(step.step_seconds), step.tokens_per_s,
                    pct(step.mfu), layout.world_size()),
        fmt::format("  pipeline {} ms ({}, pp {}, {} micro-batches, {} virtual stages): bubble {}",
                    ms(step.pipeline_seconds), to_string(layout.schedule), layout.pp(), layout.num_microbatches,
                    layout.virtual_stages, pct(step.bubble_fraction)),
        fmt::format("  communication (tp, cp ring, embd, dp, scalars; pipeline messages are in the bubble): exposed {} "
                    "ms ({} of the step), total {} ms ({}), mean over the stages",
                    ms(step.comm_exposed_seconds), pct(step.comm_exposed_share()), ms(step.comm_total_seconds),
                    pct(step.comm_total_share())),
    };
    if (step.oversubscription > 1) {
        lines.push_back(fmt::format(
            "  oversubscribed: the ranks of a node want {0:.2f}x its cores; host bound {0:.2f} x ({1} ms compute a "
            "rank + {2} ms exposed communication) = {3} ms{4} (the stages sharing their cores: {5} ms)",
            step.oversubscription, ms(step.host_compute_seconds), ms(step.comm_exposed_seconds),
            ms(step.host_bound_seconds), step.step_seconds > step.shared_cores_seconds ? ", the step" : "",
            ms(step.shared_cores_seconds)));
    }
    const std::vector<std::string> header = {
        "stage",        "busy ms",   "tp+cp ms", "p2p ms", "embd ms", "dp ms (exposed)", "gather ms (exposed)",
        "optimizer ms", "memory GiB"};
    std::vector<std::vector<std::string>> rows;
    for (size_t s = 0; s < step.stages.size(); ++s) {
        const StageResult& r = step.stages[s];
        rows.push_back({fmt::format("{}", s), ms(r.busy), ms(r.tp_comm), ms(r.p2p), ms(r.embd),
                        fmt::format("{} ({}){}", ms(r.dp_total), ms(r.dp_exposed),
                                    r.buckets > 0 ? fmt::format(" {} buckets", r.buckets) : std::string()),
                        fmt::format("{} ({})", ms(r.gather_total), ms(r.gather_exposed)), ms(r.optimizer),
                        fmt::format("{:.2f}", static_cast<double>(r.memory_bytes) / (1 << 30))});
    }
    std::vector<size_t> w(header.size());
    for (size_t i = 0; i < header.size(); ++i) w[i] = header[i].size();
    for (const auto& row : rows)
        for (size_t i = 0; i < row.size(); ++i) w[i] = std::max(w[i], row[i].size());
    const auto line = [&](const std::vector<std::string>& cells) {
        std::string l = " ";
        for (size_t i = 0; i < cells.size(); ++i) l += fmt::format(" {:>{}}", cells[i], w[i]);
        return l;
    };
    lines.push_back(line(header));
    for (const auto& row : rows) lines.push_back(line(row));
    return lines;
}

SimulatedStep simulate_step(const RunLayout& layout, const CostModel& cost, const NodeLayout& nodes,
                            ChunkCostCache* cache, const std::vector<StagePlan>* plan) {
    return simulate_stages(step_inputs(layout, cost, nodes, cache, plan));
}

}  // namespace ms::sim
