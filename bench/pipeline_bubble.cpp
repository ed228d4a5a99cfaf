// pipeline_bubble.cpp: the theoretical pipeline bubble of each schedule, from simulate() over the generated action
// lists, next to its closed form (docs/design.md §4), for pp = 4 and m = 4, 8, 16, 32.
//   build/pipeline_bubble [pp] [t_comm]
// Costs: t_forward = 1, t_backward = 2 per micro-batch through a whole stage (a chunk costs 1/v of that); t_comm
// (default 0) is added to every receive. Bubble = idle share of the step = 1 - mean busy / makespan. Closed forms:
// GPipe and 1F1B (p - 1) / (m + p - 1), interleaved (p - 1) / (v m + p - 1). "in-flight" is the most
// chunk-activations stage 0 holds at once (1F1B: p; interleaved: 2 (p - 1) + (v - 1) p + 1 chunks of 1/v size).
#include <fmt/format.h>

#include <cstdlib>

#include "engine/parallel/schedule.h"

int main(int argc, char** argv) {
    const int pp = argc > 1 ? std::atoi(argv[1]) : 4;
    const double t_comm = argc > 2 ? std::atof(argv[2]) : 0.0;
    struct Row {
        ms::ScheduleKind kind;
        int v;
    };
    const Row rows[] = {
        {ms::ScheduleKind::kGPipe, 1}, {ms::ScheduleKind::k1F1B, 1}, {ms::ScheduleKind::kInterleaved1F1B, 2}};

    fmt::print("pipeline_bubble: pp {}, t_forward 1, t_backward 2, t_comm {}\n", pp, t_comm);
    fmt::print("{:<18} {:>3} {:>4} {:>10} {:>10} {:>10} {:>10}\n", "schedule", "v", "m", "makespan", "simulated",
               "formula", "in-flight");
    for (const Row& row : rows) {
        for (int m : {4, 8, 16, 32}) {
            if (row.kind == ms::ScheduleKind::kInterleaved1F1B && m % pp != 0) continue;
            const auto schedule = ms::make_schedule(row.kind, pp, m, row.v);
            const ms::SimResult r = ms::simulate(schedule, 1.0, 2.0, t_comm);
            const double formula = (pp - 1.0) / (row.v * m + pp - 1.0);
            fmt::print("{:<18} {:>3} {:>4} {:>10.3f} {:>9.2f}% {:>9.2f}% {:>10}{}\n", ms::to_string(row.kind), row.v, m,
                       r.makespan, 100 * r.bubble_fraction, 100 * formula, ms::max_in_flight(schedule[0]),
                       r.deadlock ? "  DEADLOCK" : "");
        }
    }
    return 0;
}
