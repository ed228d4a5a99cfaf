// test_schedule.cpp: the pipeline schedule generators and the simulator (engine/parallel/schedule.h).
//
// Every schedule for pp 1..8, m 1..32 (and v 1..4 for the interleaved one, where m % pp == 0) is checked for:
// each (micro-batch, chunk) computed exactly once forward and once backward per stage, forward first, data
// dependencies met, send/recv placed around the compute they serve, every send matched by exactly one receive and
// in the same order per (stage pair, direction), no deadlock, the activation-memory bound, the bubble against its
// closed form, and the point-to-point batches (runs of sends and receives) under NCCL's semantics
// (check_in_order_p2p): no deadlock, every message paired with itself. Timings are small integers (t_forward = 1,
// t_backward = 2) so that the simulated times are exact; the 1e-12 tolerance only absorbs the final division and
// the 1/v chunk costs for v = 3.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "engine/core/check.h"
#include "engine/parallel/schedule.h"

namespace ms {
// Readable failure messages for actions.
void PrintTo(const Action& a, std::ostream* os) { *os << to_string(a); }
}  // namespace ms

namespace {

using ms::Action;
using ms::ScheduleKind;
using Kind = Action::Kind;
using Schedule = std::vector<std::vector<Action>>;

struct Case {
    ScheduleKind kind;
    int pp, m, v;
    std::string name() const {
        return std::string(ms::to_string(kind)) + " pp " + std::to_string(pp) + " m " + std::to_string(m) + " v " +
               std::to_string(v);
    }
};

// Every valid configuration: gpipe and 1f1b with v = 1; interleaved with v 1..4 and m a multiple of pp.
std::vector<Case> all_cases() {
    std::vector<Case> cases;
    for (int pp = 1; pp <= 8; ++pp) {
        for (int m = 1; m <= 32; ++m) {
            cases.push_back({ScheduleKind::kGPipe, pp, m, 1});
            cases.push_back({ScheduleKind::k1F1B, pp, m, 1});
            for (int v = 1; v <= 4 && m % pp == 0; ++v) cases.push_back({ScheduleKind::kInterleaved1F1B, pp, m, v});
        }
    }
    return cases;
}

bool is_compute(const Action& a) { return a.kind == Kind::kForward || a.kind == Kind::kBackward; }

// The compute actions of one stage as a compact string, e.g. "F0 F1 B0 F2 ..." (chunk suffix ".c" when v > 1).
std::string computes(const std::vector<Action>& actions, bool with_chunk) {
    std::string out;
    for (const Action& a : actions) {
        if (!is_compute(a)) continue;
        if (!out.empty()) out += ' ';
        out += a.kind == Kind::kForward ? 'F' : 'B';
        out += std::to_string(a.microbatch);
        if (with_chunk) {
            out += '.';
            out += std::to_string(a.chunk);
        }
    }
    return out;
}

// The full list one stage should have for its compute order, written independently of the generator: model chunk
// k = chunk * pp + stage; a recv right before a compute whose input comes from another stage, a send right after a
// compute whose output goes to another stage.
std::vector<Action> expected_with_comm(const std::vector<Action>& actions, int stage, int pp, int v) {
    const int last = pp * v - 1;
    std::vector<Action> out;
    for (const Action& a : actions) {
        if (!is_compute(a)) continue;
        const int k = a.chunk * pp + stage;
        const int prev = (k + pp - 1) % pp, next = (k + 1) % pp;
        if (a.kind == Kind::kForward) {
            if (k > 0 && prev != stage) out.push_back({Kind::kRecvActivation, a.microbatch, a.chunk, prev});
            out.push_back(a);
            if (k < last && next != stage) out.push_back({Kind::kSendActivation, a.microbatch, a.chunk, next});
        } else {
            if (k < last && next != stage) out.push_back({Kind::kRecvGrad, a.microbatch, a.chunk, next});
            out.push_back(a);
            if (k > 0 && prev != stage) out.push_back({Kind::kSendGrad, a.microbatch, a.chunk, prev});
        }
    }
    return out;
}

// `actions` holds the same sends and receives as `around` (a send right after its compute, a receive right before)
// and each sits in the nearest batch on the same side of its compute.
void expect_batched_around_compute(const std::vector<Action>& actions, const std::vector<Action>& around,
                                   const std::string& name) {
    const auto position = [&](const Action& a) {
        return std::find(actions.begin(), actions.end(), a) - actions.begin();
    };
    ASSERT_EQ(actions.size(), around.size()) << name;
    for (size_t j = 0; j < around.size(); ++j) {
        const Action& a = around[j];
        if (is_compute(a)) continue;
        const bool recv = a.kind == Kind::kRecvActivation || a.kind == Kind::kRecvGrad;
        const Action& compute = around[recv ? j + 1 : j - 1];  // the compute it serves
        const auto at = position(a), c = position(compute);
        ASSERT_LT(at, static_cast<long>(actions.size())) << name << ": no " << ms::to_string(a);
        ASSERT_EQ(at < c, recv) << name << ": " << ms::to_string(a);
        // Between a receive and its compute no batch but its own (no p2p action after a compute); between a
        // compute and its send only computes and the send's own batch (no compute after a p2p action).
        bool seen_compute = false, seen_p2p = false;
        for (auto i = std::min(at, c) + 1; i < std::max(at, c); ++i) {
            const bool p2p = !is_compute(actions[static_cast<size_t>(i)]);
            ASSERT_FALSE(recv ? p2p && seen_compute : !p2p && seen_p2p)
                << name << ": " << ms::to_string(a) << " is not in the nearest batch";
            (p2p ? seen_p2p : seen_compute) = true;
        }
    }
}

int expected_max_in_flight(const Case& c, int stage) {
    switch (c.kind) {
        case ScheduleKind::kGPipe:
            return c.m;
        case ScheduleKind::k1F1B:
            return std::min(c.pp - stage, c.m);
        case ScheduleKind::kInterleaved1F1B:
            // Megatron: warm-up of 2 (pp - s - 1) + (v - 1) pp chunk-forwards (all v m when m == pp), plus the one
            // forward the steady state runs before its first backward.
            return c.m == c.pp ? c.v * c.m : std::min(2 * (c.pp - stage - 1) + (c.v - 1) * c.pp + 1, c.v * c.m);
    }
    return -1;
}

TEST(ScheduleTest, EveryChunkComputedOnceForwardThenBackwardWithDependenciesMet) {
    for (const Case& c : all_cases()) {
        const Schedule sched = ms::make_schedule(c.kind, c.pp, c.m, c.v);
        ASSERT_EQ(static_cast<int>(sched.size()), c.pp) << c.name();
        for (int s = 0; s < c.pp; ++s) {
            // position of F / B of (mb, chunk) in the stage's list
            std::map<std::pair<int, int>, int> fwd_at, bwd_at;
            for (int i = 0; i < static_cast<int>(sched[s].size()); ++i) {
                const Action& a = sched[s][i];
                ASSERT_TRUE(a.microbatch >= 0 && a.microbatch < c.m && a.chunk >= 0 && a.chunk < c.v) << c.name();
                if (!is_compute(a)) continue;
                ASSERT_EQ(a.peer_stage, -1) << c.name();
                auto& at = a.kind == Kind::kForward ? fwd_at : bwd_at;
                ASSERT_TRUE(at.emplace(std::pair{a.microbatch, a.chunk}, i).second)
                    << c.name() << " stage " << s << ": " << ms::to_string(a) << " twice";
            }
            ASSERT_EQ(static_cast<int>(fwd_at.size()), c.m * c.v) << c.name();
            ASSERT_EQ(static_cast<int>(bwd_at.size()), c.m * c.v) << c.name();
            for (const auto& [key, f] : fwd_at) {
                const auto [mb, chunk] = key;
                ASSERT_LT(f, bwd_at.at(key)) << c.name() << " stage " << s << " mb " << mb << " chunk " << chunk;
                // Hand-offs between chunks of the same stage (pp == 1) need the producer earlier in the list.
                if (c.pp == 1 && chunk > 0) {
                    ASSERT_LT(fwd_at.at({mb, chunk - 1}), f) << c.name();
                }
                if (c.pp == 1 && chunk + 1 < c.v) {
                    ASSERT_LT(bwd_at.at({mb, chunk + 1}), bwd_at.at(key)) << c.name();
                }
            }
            // GPipe, 1F1B: sends and receives sit exactly around the compute they serve. Interleaved (Megatron's
            // batches after forward + backward pairs): each receive in the last batch before the compute it serves,
            // each send in the first batch after the compute that produced it.
            const std::vector<Action> expected = expected_with_comm(sched[s], s, c.pp, c.v);
            if (c.kind != ScheduleKind::kInterleaved1F1B) {
                ASSERT_EQ(sched[s], expected) << c.name() << " stage " << s;
            } else {
                expect_batched_around_compute(sched[s], expected, c.name() + " stage " + std::to_string(s));
            }
        }
    }
}

TEST(ScheduleTest, EverySendHasExactlyOneMatchingReceiveInTheSameOrder) {
    for (const Case& c : all_cases()) {
        const Schedule sched = ms::make_schedule(c.kind, c.pp, c.m, c.v);
        // Messages per (from, to, is_grad), in issue order, named by (micro-batch, producing model chunk).
        using Channel = std::tuple<int, int, bool>;
        std::map<Channel, std::vector<std::pair<int, int>>> sent, received;
        for (int s = 0; s < c.pp; ++s) {
            for (const Action& a : sched[s]) {
                const int k = a.chunk * c.pp + s;
                switch (a.kind) {
                    case Kind::kSendActivation:
                        sent[{s, a.peer_stage, false}].push_back({a.microbatch, k});
                        break;
                    case Kind::kSendGrad:
                        sent[{s, a.peer_stage, true}].push_back({a.microbatch, k});
                        break;
                    case Kind::kRecvActivation:
                        received[{a.peer_stage, s, false}].push_back({a.microbatch, k - 1});
                        break;
                    case Kind::kRecvGrad:
                        received[{a.peer_stage, s, true}].push_back({a.microbatch, k + 1});
                        break;
                    default:
                        break;
                }
            }
        }
        // Equal sequences per channel: one receive per send, and in-order matching pairs the right tensors.
        ASSERT_EQ(sent, received) << c.name();
        for (const auto& [channel, messages] : sent) {
            const auto [from, to, grad] = channel;
            ASSERT_EQ(std::set(messages.begin(), messages.end()).size(), messages.size()) << c.name();
            for (const auto& [mb, k] : messages) {
                ASSERT_EQ(from, k % c.pp) << c.name();  // the producer runs on the sender
                ASSERT_EQ(to, (grad ? k - 1 : k + 1) % c.pp) << c.name();
            }
        }
    }
}

TEST(ScheduleTest, NoDeadlockAndBubbleMatchesClosedForm) {
    for (const Case& c : all_cases()) {
        const Schedule sched = ms::make_schedule(c.kind, c.pp, c.m, c.v);
        const ms::SimResult r = ms::simulate(sched, 1.0, 2.0);
        ASSERT_FALSE(r.deadlock) << c.name();
        // GPipe and 1F1B: (p - 1) / (m + p - 1). Interleaved: (p - 1) / (v m + p - 1), exact for every case here
        // (Megatron's warm-up keeps the critical path at v m + p - 1 chunk-slots), including v = 1 and m == pp.
        const double expected = (c.pp - 1.0) / (c.v * c.m + c.pp - 1.0);
        ASSERT_NEAR(r.bubble_fraction, expected, 1e-12) << c.name();
        ASSERT_NEAR(r.makespan, 3.0 * c.m + 3.0 * (c.pp - 1) / c.v, 1e-12) << c.name();
        for (double busy : r.busy) ASSERT_NEAR(busy, 3.0 * c.m, 1e-12) << c.name();

        // Communication latency never deadlocks and only stretches the step.
        const ms::SimResult slow = ms::simulate(sched, 1.0, 2.0, 0.25);
        ASSERT_FALSE(slow.deadlock) << c.name();
        ASSERT_GE(slow.makespan, r.makespan) << c.name();
        if (c.pp == 1) {
            ASSERT_EQ(slow.makespan, r.makespan) << c.name();  // nothing to send
        }
    }
}

TEST(ScheduleTest, InFlightActivationsMatchTheScheduleBound) {
    for (const Case& c : all_cases()) {
        const Schedule sched = ms::make_schedule(c.kind, c.pp, c.m, c.v);
        for (int s = 0; s < c.pp; ++s) {
            ASSERT_EQ(ms::max_in_flight(sched[s]), expected_max_in_flight(c, s)) << c.name() << " stage " << s;
        }
    }
}

// Written out by hand from Megatron's loops, pp 3, m 4: warm-up 2 / 1 / 0 forwards.
TEST(ScheduleTest, OneFOneBMatchesMegatronByHand) {
    const Schedule sched = ms::make_schedule(ScheduleKind::k1F1B, 3, 4, 1);
    EXPECT_EQ(computes(sched[0], false), "F0 F1 F2 B0 F3 B1 B2 B3");
    EXPECT_EQ(computes(sched[1], false), "F0 F1 B0 F2 B1 F3 B2 B3");
    EXPECT_EQ(computes(sched[2], false), "F0 B0 F1 B1 F2 B2 F3 B3");
    // The middle stage in full: receive before, send after every compute.
    ASSERT_GE(sched[1].size(), 6u);
    EXPECT_EQ(sched[1][0], (Action{Kind::kRecvActivation, 0, 0, 0}));
    EXPECT_EQ(sched[1][1], (Action{Kind::kForward, 0, 0, -1}));
    EXPECT_EQ(sched[1][2], (Action{Kind::kSendActivation, 0, 0, 2}));
    EXPECT_EQ(sched[1][3], (Action{Kind::kRecvActivation, 1, 0, 0}));

    const Schedule gpipe = ms::make_schedule(ScheduleKind::kGPipe, 3, 4, 1);
    for (int s = 0; s < 3; ++s) EXPECT_EQ(computes(gpipe[s], false), "F0 F1 F2 F3 B0 B1 B2 B3");
}

// Megatron's interleaved loops by hand, pp 2, m 4, v 2: iteration order (mb.chunk) 0.0 1.0 0.1 1.1 2.0 3.0 2.1 3.1,
// backwards with the chunks reversed; warm-up 2 (p - s - 1) + (v - 1) p = 4 / 2.
TEST(ScheduleTest, InterleavedMatchesMegatronByHand) {
    const Schedule sched = ms::make_schedule(ScheduleKind::kInterleaved1F1B, 2, 4, 2);
    EXPECT_EQ(computes(sched[0], true),
              "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
    EXPECT_EQ(computes(sched[1], true),
              "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
    // The last stage's chunk 0 feeds stage 0's chunk 1.
    const auto& last = sched[1];
    EXPECT_NE(std::find(last.begin(), last.end(), Action{Kind::kSendActivation, 0, 0, 0}), last.end());
    EXPECT_NE(std::find(sched[0].begin(), sched[0].end(), Action{Kind::kRecvActivation, 0, 1, 1}), sched[0].end());
    // m == pp: Megatron runs every forward first.
    const Schedule all_warmup = ms::make_schedule(ScheduleKind::kInterleaved1F1B, 2, 2, 2);
    EXPECT_EQ(computes(all_warmup[1], true), "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
}

TEST(ScheduleTest, SimulatorDetectsDeadlockAndCountsCommunication) {
    // Both stages wait for each other's message first.
    const Schedule crossed = {
        {{Kind::kRecvGrad, 0, 0, 1}, {Kind::kForward, 0, 0, -1}, {Kind::kSendActivation, 0, 0, 1}},
        {{Kind::kRecvActivation, 0, 0, 0}, {Kind::kForward, 0, 0, -1}, {Kind::kSendGrad, 0, 0, 0}},
    };
    EXPECT_TRUE(ms::simulate(crossed, 1, 2).deadlock);
    // A receive from the wrong stage never matches.
    Schedule wrong_peer = ms::make_schedule(ScheduleKind::k1F1B, 3, 2, 1);
    for (Action& a : wrong_peer[2]) {
        if (a.kind == Kind::kRecvActivation) a.peer_stage = 0;
    }
    EXPECT_TRUE(ms::simulate(wrong_peer, 1, 2).deadlock);
    // pp 2, m 1: F0 | comm | F1 B1 | comm | B0.
    const ms::SimResult r = ms::simulate(ms::make_schedule(ScheduleKind::k1F1B, 2, 1, 1), 1, 2, 0.5);
    EXPECT_FALSE(r.deadlock);
    EXPECT_DOUBLE_EQ(r.makespan, 1 + 0.5 + 1 + 2 + 0.5 + 2);
    EXPECT_EQ(r.busy, (std::vector<double>{3, 3}));
    EXPECT_DOUBLE_EQ(r.bubble_fraction, 1 - 3 / 7.0);
}

// A stage's list as its point-to-point batches, e.g. "ra0 | sa0 ra1 | sa1 rg0" (chunk suffix ".c" when v > 1).
std::string batches(const std::vector<Action>& actions, bool with_chunk) {
    std::string out;
    for (size_t i = 0; i < actions.size(); ++i) {
        const Action& a = actions[i];
        if (is_compute(a)) continue;
        if (!out.empty() && out.back() != ' ') out += ' ';
        out += a.kind == Kind::kSendActivation   ? "sa"
               : a.kind == Kind::kRecvActivation ? "ra"
               : a.kind == Kind::kSendGrad       ? "sg"
                                                 : "rg";
        out += std::to_string(a.microbatch);
        if (with_chunk) out += "." + std::to_string(a.chunk);
        if (ms::ends_p2p_batch(actions, i) && i + 1 < actions.size()) out += " |";
    }
    while (!out.empty() && (out.back() == '|' || out.back() == ' ')) out.pop_back();
    return out;
}

TEST(ScheduleTest, BatchesNeverDeadlockAndPairTheSameMessagesUnderNcclSemantics) {
    for (const Case& c : all_cases()) {
        EXPECT_EQ(ms::check_in_order_p2p(ms::make_schedule(c.kind, c.pp, c.m, c.v)), "") << c.name();
    }
    for (int pp = 1; pp <= 8; ++pp) {
        for (int v = 1; v <= 4; ++v) {
            EXPECT_EQ(ms::check_in_order_p2p(ms::make_forward_schedule(pp, v)), "")
                << "forward pp " << pp << " v " << v;
        }
    }
}

TEST(ScheduleTest, BatchesAreMegatronsCombinedSendsAndReceives) {
    // 1F1B, pp 4, m 8, stage 1: warm-up send_forward_recv_forward, steady send_forward_recv_backward and
    // send_backward_recv_forward, cool-down send_backward_recv_backward, and the last send alone.
    const Schedule s = ms::make_schedule(ScheduleKind::k1F1B, 4, 8, 1);
    EXPECT_EQ(
        batches(s[1], false),
        "ra0 | sa0 ra1 | sa1 ra2 | sa2 rg0 | sg0 ra3 | sa3 rg1 | sg1 ra4 | sa4 rg2 | sg2 ra5 | sa5 rg3 | sg3 ra6 | "
        "sa6 rg4 | sg4 ra7 | sa7 rg5 | sg5 rg6 | sg6 rg7 | sg7");
    // The first and last stages have one neighbour: their batches pair a send with a receive from the same peer.
    EXPECT_EQ(batches(s[0], false),
              "sa0 | sa1 | sa2 | sa3 rg0 | sa4 rg1 | sa5 rg2 | sa6 rg3 | sa7 rg4 | rg5 | rg6 | rg7");
    EXPECT_EQ(batches(s[3], false), "ra0 | sg0 ra1 | sg1 ra2 | sg2 ra3 | sg3 ra4 | sg4 ra5 | sg5 ra6 | sg6 ra7 | sg7");
    // Interleaved, pp 2, v 2, m 4, stage 0: a batch after each warm-up forward, after each forward + backward
    // pair (send_forward_backward_recv_forward_backward: a gradient received one forward ahead of its backward), after
    // each cool-down backward.
    const Schedule i = ms::make_schedule(ScheduleKind::kInterleaved1F1B, 2, 4, 2);
    EXPECT_EQ(computes(i[0], true), "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
    EXPECT_EQ(batches(i[0], true),
              "sa0.0 | sa1.0 ra0.1 | sa0.1 ra1.1 | sa1.1 rg0.1 | sa2.0 sg0.1 rg1.1 | sa3.0 sg1.1 ra2.1 rg0.0 | sa2.1 "
              "ra3.1 rg1.0 | sa3.1 rg2.1 | sg2.1 rg3.1 | sg3.1 rg2.0 | rg3.0");
    // Evaluation: pp 2, v 2 hands the activation on and takes the next chunk's input in one batch.
    const Schedule f = ms::make_forward_schedule(2, 2);
    EXPECT_EQ(batches(f[0], true), "sa0.0 ra0.1 | sa0.1");
    EXPECT_EQ(batches(f[1], true), "ra0.0 | sa0.0 ra0.1");
}

TEST(ScheduleTest, InOrderCheckerFindsDeadlocksAndMismatchedMessages) {
    // Each stage's send is a batch of its own before the receive the peer needs to post first.
    const Schedule unpaired = {
        {{Kind::kSendActivation, 1, 0, 1}, {Kind::kForward, 2, 0, -1}, {Kind::kRecvGrad, 0, 0, 1}},
        {{Kind::kSendGrad, 0, 0, 0}, {Kind::kBackward, 0, 0, -1}, {Kind::kRecvActivation, 1, 0, 0}},
    };
    EXPECT_EQ(ms::check_in_order_p2p(unpaired),
              "stage 0 waits forever on its batch at action 0 (send-act mb1 c0 -> 1)");
    // The same messages in one batch each: Megatron's send_forward_recv_backward and send_backward_recv_forward.
    const Schedule paired = {
        {{Kind::kSendActivation, 1, 0, 1}, {Kind::kRecvGrad, 0, 0, 1}},
        {{Kind::kSendGrad, 0, 0, 0}, {Kind::kRecvActivation, 1, 0, 0}},
    };
    EXPECT_EQ(ms::check_in_order_p2p(paired), "");
    // Tags would pair these; issue order pairs mb0's send with mb1's receive.
    const Schedule swapped = {
        {{Kind::kSendActivation, 0, 0, 1}, {Kind::kSendActivation, 1, 0, 1}},
        {{Kind::kRecvActivation, 1, 0, 0}, {Kind::kRecvActivation, 0, 0, 0}},
    };
    EXPECT_EQ(ms::check_in_order_p2p(swapped),
              "message 0 from stage 0 to stage 1 is sent as mb0 chunk 0 -> 1 and received as mb1 chunk 0 -> 1");
}

TEST(ScheduleTest, RejectsInvalidConfigurationsNamingTheNumbers) {
    try {
        ms::check_schedule(ScheduleKind::kInterleaved1F1B, 4, 6, 2);
        FAIL() << "expected a UserError";
    } catch (const ms::UserError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("number of micro-batches (6) to be a multiple of pipeline_model_parallel_size(4)"),
                  std::string::npos)
            << msg;
        EXPECT_NE(msg.find("---> HINT: use 4 or 8 micro-batches"), std::string::npos) << msg;
    }
    EXPECT_THROW(ms::check_schedule(ScheduleKind::kInterleaved1F1B, 4, 2, 2), ms::UserError);
    EXPECT_THROW(ms::check_schedule(ScheduleKind::k1F1B, 4, 8, 2), ms::UserError);
    EXPECT_THROW(ms::check_schedule(ScheduleKind::kGPipe, 0, 8, 1), ms::UserError);
    EXPECT_THROW(ms::check_schedule(ScheduleKind::k1F1B, 4, 0, 1), ms::UserError);
    EXPECT_THROW(ms::check_schedule(ScheduleKind::kInterleaved1F1B, 4, 8, 0), ms::UserError);
    EXPECT_NO_THROW(ms::check_schedule(ScheduleKind::kInterleaved1F1B, 4, 8, 2));
    EXPECT_EQ(ms::schedule_error(ScheduleKind::k1F1B, 4, 3, 1), "");
}

TEST(ScheduleTest, KindNamesRoundTrip) {
    for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved1F1B}) {
        EXPECT_EQ(ms::parse_schedule_kind(ms::to_string(k)), k);
    }
    EXPECT_THROW(ms::parse_schedule_kind("zero_bubble"), ms::UserError);
}

}  // namespace
