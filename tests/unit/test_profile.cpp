// test_profile.cpp: device profiles and the cost model over them (engine/sim/profile.h): the file's exact round trip
// and its errors, the rate interpolation and the cost formula on hand-set numbers, the estimates' peaks against
// device_peak.cpp's table, the FLOPs of a GPT graph's ops by hand, and `mindspeed-train calibrate --quick`.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include "engine/config/config.h"
#include "engine/core/check.h"
#include "engine/model/gpt_graph.h"
#include "engine/sim/link_probe.h"
#include "engine/sim/profile.h"
#include "engine/train/device_peak.h"
#include "engine/train/plan.h"
#include "tests/common/job_run.h"
#include "tests/common/temp_dir.h"

namespace ms::test {
namespace {

using sim::OpFamily;

// The message of the UserError f throws ("" when it throws none).
template <class F>
std::string user_error_of(F f) {
    try {
        f();
    } catch (const UserError& e) {
        return e.what();
    }
    return "";
}

// The GPT the op tests build: one layer, C = 48, NH = 4 (HS = 12), T = 16, F = 4C, V = 61 padded to Vp = 128.
GptShape small_gpt() {
    GptShape s;
    s.L = 1, s.C = 48, s.NH = 4, s.T = 16, s.V = 61, s.Vp = 128, s.F = 192;
    return s;
}

// A profile of one fp32 table whose every family has `curve`.
sim::Profile hand_profile(const sim::FamilyCurve& curve) {
    sim::Profile p;
    p.name = "hand";
    p.device = "a device";
    p.backend = "cpu";
    p.threads = 2;
    p.cores = 8;
    p.date = "2026-12-02T00:00:00Z";
    p.source = "hand-set";
    p.memory_bytes_per_s = 1e8;
    p.intra_node = {1e-5, 1e9};
    p.inter_node = {1e-4, 1.25e8};
    p.links_source = "hand-set";
    sim::DTypeTable t;
    t.matmul_peak_flops = 4e9;
    t.peak_source = "hand-set";
    for (sim::FamilyCurve& c : t.families) c = curve;
    p.tables.push_back(t);
    return p;
}

TEST(Profile, FileRoundTripIsExact) {
    // numbers without a short decimal form, and every estimate
    sim::FamilyCurve awkward{.overhead_s = 1.0 / 3.0, .points = {{0.1, 1.0 / 7.0}, {2.0 / 3.0, 1e300}, {1e301, 5e-7}}};
    std::vector<sim::Profile> profiles = {hand_profile(awkward)};
    profiles[0].intra_node.reduce_bytes_per_s = 1.0 / 3.0 * 1e10;
    profiles[0].tables[0].shape_seconds = {{"matmul_fwd 128x256x1024x1", 1.0 / 3.0 * 1e-3},
                                           {"attention_bwd 1x2x3x3x4", 5e-7}};
    profiles[0].tables.push_back(profiles[0].tables[0]);
    profiles[0].tables[1].dtype = DType::kBF16;
    for (const std::string& name : sim::estimate_profile_names()) profiles.push_back(sim::estimate_profile(name));
    TempDir dir("ms_profile");
    for (const sim::Profile& p : profiles) {
        sim::save_profile(p, dir / "p.json");
        const sim::Profile back = sim::load_profile(dir / "p.json");
        EXPECT_TRUE(back == p) << p.name;
        EXPECT_EQ(sim::profile_to_json(back), sim::profile_to_json(p));
    }
}

TEST(Profile, RateIsPiecewiseLinearInLogWork) {
    const sim::FamilyCurve c{.points = {{2, 10}, {8, 30}, {64, 60}}};
    EXPECT_EQ(c.rate_at(1), 10);  // before the first point: its rate
    EXPECT_EQ(c.rate_at(2), 10);
    EXPECT_DOUBLE_EQ(c.rate_at(4), 20);  // log 4 is halfway between log 2 and log 8
    EXPECT_EQ(c.rate_at(8), 30);
    EXPECT_DOUBLE_EQ(c.rate_at(16), 40);  // a third of the way from log 8 to log 64
    EXPECT_EQ(c.rate_at(64), 60);
    EXPECT_EQ(c.rate_at(1e9), 60);  // after the last: its rate
}

TEST(Profile, CostIsOverheadPlusTheSlowerOfFlopsAndBytes) {
    sim::Profile p = hand_profile({.overhead_s = 1e-6, .points = {{1, 1e9}}});
    p.tables.push_back(p.tables[0]);
    p.tables[1].dtype = DType::kBF16;
    const sim::ProfileCostModel m(p);
    // compute-bound: its curve's FLOP/s against the profile's memory bandwidth (1e8 B/s)
    EXPECT_DOUBLE_EQ(m.seconds({OpFamily::kMatmulForward, 2e6, 1e5}, DType::kF32), 1e-6 + 2e-3);
    EXPECT_DOUBLE_EQ(m.seconds({OpFamily::kMatmulForward, 2e6, 1e6}, DType::kF32), 1e-6 + 1e-2);
    // memory-bound: its curve's bytes/s against the table's matmul peak (4e9 FLOP/s)
    EXPECT_DOUBLE_EQ(m.seconds({OpFamily::kResidual, 0, 3e6}, DType::kF32), 1e-6 + 3e-3);
    EXPECT_DOUBLE_EQ(m.seconds({OpFamily::kResidual, 4e8, 3e6}, DType::kF32), 1e-6 + 1e-1);
    // a fused GELU's bytes at its family's rate (1e9 B/s) after the matmul's time, without a launch of its own
    EXPECT_DOUBLE_EQ(m.seconds({OpFamily::kMatmulForward, 2e6, 1e5, OpFamily::kActivationForward, 3e6}, DType::kF32),
                     1e-6 + 2e-3 + 3e-3);
    EXPECT_EQ(m.seconds({OpFamily::kMemset, 0, 0}, DType::kF32), 0);               // no work, no launch
    EXPECT_DOUBLE_EQ(m.optimizer_seconds(1000, DType::kF32), 1e-6 + 28e3 / 1e9);   // 7 fp32 reads and writes each
    EXPECT_DOUBLE_EQ(m.optimizer_seconds(1000, DType::kBF16), 1e-6 + 30e3 / 1e9);  // and the bf16 copy
    EXPECT_DOUBLE_EQ(m.memory_seconds(5000), 1e-6 + 5e-6);
    EXPECT_EQ(m.peak_flops(DType::kF32), 4e9);
    EXPECT_EQ(m.links().intra.alpha_s, 1e-5);
    EXPECT_EQ(m.links().inter.bytes_per_s, 1.25e8);
    EXPECT_EQ(m.links().occupancy, nullptr);
    const std::string msg = user_error_of([&] { m.peak_flops(DType::kF16); });
    EXPECT_NE(msg.find("profile 'hand' has no fp16 measurements (it holds fp32, bf16)"), std::string::npos) << msg;
}

// An oversubscribed host (simulator.h step 7): ranks x threads over the cores, never below 1; 1 on a GPU.
TEST(Profile, OversubscriptionIsRanksTimesThreadsOverCores) {
    sim::Profile p = hand_profile({.overhead_s = 0, .points = {{1, 1e9}}});
    p.threads = 1, p.cores = 2;
    EXPECT_EQ(sim::ProfileCostModel(p).oversubscription(1), 1.0);
    EXPECT_EQ(sim::ProfileCostModel(p).oversubscription(2), 1.0);
    EXPECT_EQ(sim::ProfileCostModel(p).oversubscription(3), 1.5);
    EXPECT_EQ(sim::ProfileCostModel(p).oversubscription(8), 4.0);
    p.threads = 2, p.cores = 8;
    EXPECT_EQ(sim::ProfileCostModel(p).oversubscription(4), 1.0);
    EXPECT_EQ(sim::ProfileCostModel(p).oversubscription(6), 1.5);
    p.cores = 0;  // a GPU: each rank owns its device
    EXPECT_EQ(sim::ProfileCostModel(p).oversubscription(64), 1.0);
    for (const std::string& name : sim::estimate_profile_names())
        EXPECT_EQ(sim::ProfileCostModel(sim::estimate_profile(name)).oversubscription(8), 1.0) << name;
}

// The link's fit: alpha the smallest message's one-way time, bytes/s the slope to the largest.
TEST(Profile, LinkFitIsTheSmallestTimeAndTheSlope) {
    const LinkParams l = sim::fit_link({{8, 0.5}, {520, 1.5}, {1032, 2.5}});
    EXPECT_EQ(l.alpha_s, 0.5);
    EXPECT_EQ(l.bytes_per_s, 512.0);  // (1032 - 8) B over (2.5 - 0.5) s
    EXPECT_EQ(l.seconds(1032), 0.5 + 1032.0 / 512.0);

    // The reduction rate: all-reduces over 2 ranks of a link of alpha 1 us and 1e9 B/s, each taking its ring's
    // transfers (2 alpha + n / beta), 5 us more, and the n / 2 bytes each rank adds at 2e9 B/s: the slope gives the
    // 2e9 back, the 5 us drops out. All-reduces no slower than their transfers: free (0).
    const LinkParams link{1e-6, 1e9};
    const auto all_reduce = [&](double n, double rate) {
        return sim::LinkSample{n, 2e-6 + n / 1e9 + 5e-6 + (rate > 0 ? n / 2 / rate : 0.0)};
    };
    EXPECT_NEAR(sim::fit_reduce_rate(link, {all_reduce(1 << 20, 2e9), all_reduce(8 << 20, 2e9)}, 2), 2e9, 1e-3);
    EXPECT_EQ(sim::fit_reduce_rate(link, {all_reduce(1 << 20, 0), all_reduce(8 << 20, 0)}, 2), 0);
}

TEST(Profile, BadFilesAreNamedWithWhatIsWrong) {
    TempDir dir("ms_profile");
    const std::string path = dir / "p.json";
    auto error_with = [&](const std::string& text) {
        std::ofstream(path) << text;
        return user_error_of([&] { sim::load_profile(path); });
    };
    auto expect_has = [](const std::string& msg, const std::string& what) {
        EXPECT_NE(msg.find(what), std::string::npos) << msg;
        EXPECT_NE(msg.find("HINT: write a profile with `mindspeed-train calibrate --output FILE`"), std::string::npos)
            << msg;
    };
    expect_has(user_error_of([&] { sim::load_profile(dir / "none.json"); }),
               "profile error: '" + (dir / "none.json") + "' does not exist");
    expect_has(error_with("{\"format\": "), "profile error: '" + path + "' is not valid JSON");
    expect_has(error_with("[1, 2]"), "'" + path + "' is not a profile");
    const std::string good = sim::profile_to_json(sim::estimate_profile("h100"));
    auto edited = [&](const std::function<void(nlohmann::ordered_json&)>& edit) {
        nlohmann::ordered_json j = nlohmann::ordered_json::parse(good);
        edit(j);
        return error_with(j.dump(1));
    };
    using J = nlohmann::ordered_json;
    expect_has(edited([](J& j) { j["version"] = 1; }), "has version 1; this build reads version 2");
    expect_has(edited([](J& j) { j.erase("cores"); }), "has no \"cores\"");
    expect_has(edited([](J& j) { j.erase("date"); }), "has no \"date\"");
    expect_has(edited([](J& j) { j["tables"][0]["families"]["matmul_bwx"] = 1; }),
               "has an unknown op family \"matmul_bwx\" in the fp32 table");
    expect_has(edited([](J& j) { j["tables"][1]["families"].erase("adamw"); }), "has no \"adamw\" in the bf16 table");
    expect_has(edited([](J& j) { j["tables"][1]["dtype"] = "fp8"; }), "has a table for dtype \"fp8\"");
    expect_has(edited([](J& j) { j["tables"][1]["dtype"] = "fp32"; }), "has two tables for fp32");
    expect_has(edited([](J& j) {
                   j["tables"][0]["shape_seconds"] = {{"matmul_fwd 1x2x3x1", -1}};
               }),
               "has -1 for \"matmul_fwd 1x2x3x1\" in \"shape_seconds\" in the fp32 table, which must be > 0");
    expect_has(edited([](J& j) { j["tables"][0]["shape_seconds"] = J::array(); }),
               "has [] for \"shape_seconds\" in the fp32 table, not an object");
    expect_has(edited([](J& j) { j["memory_bytes_per_s"] = -1; }),
               "has -1 for \"memory_bytes_per_s\", which must be > 0");
    expect_has(edited([](J& j) { j["links"]["inter_node"]["bytes_per_s"] = "fast"; }),
               "has \"fast\" for \"bytes_per_s\" in \"links\".\"inter_node\", not a number");
    expect_has(edited([](J& j) { j["tables"][0]["families"]["residual"]["points"][1][0] = 1; }),
               "has \"points\" in the fp32 table's \"residual\" whose work does not ascend at [1,");
    expect_has(edited([](J& j) {
                   j["tables"][0]["families"]["residual"]["points"][0] = {1, 0};
               }),
               "has [1,0] in \"points\" in the fp32 table's \"residual\", not a [work, rate] pair of positive numbers");
    EXPECT_EQ(error_with(good), "");
}

TEST(Profile, EstimatesUseTheDevicePeakTable) {
    for (const std::string& name : sim::estimate_profile_names()) {
        const sim::ProfileCostModel m(sim::estimate_profile(name));
        const DevicePeak* peak = find_device_peak(m.profile().device);
        ASSERT_NE(peak, nullptr) << name;
        EXPECT_EQ(m.peak_flops(DType::kBF16), peak->bf16) << name;
        EXPECT_EQ(m.peak_flops(DType::kF16), peak->bf16) << name;
        EXPECT_EQ(m.peak_flops(DType::kF32), peak->fp32) << name;
        EXPECT_TRUE(m.profile().estimate);
        EXPECT_NE(m.describe().find("ESTIMATE"), std::string::npos) << m.describe();
        // a large GEMM runs near the assumed efficiency, a tiny one far below it
        const double big = 1e13, small = 1e7;
        const double big_mfu = big / m.seconds({OpFamily::kMatmulForward, big, 0}, DType::kBF16) / peak->bf16;
        const double small_mfu = small / m.seconds({OpFamily::kMatmulForward, small, 0}, DType::kBF16) / peak->bf16;
        EXPECT_GT(big_mfu, 0.5) << name;
        EXPECT_LT(big_mfu, 0.54) << name;
        EXPECT_LT(small_mfu, 0.01) << name;
    }
    EXPECT_EQ(sim::estimate_profile("a100-80g").tables.size(), 3u);
    EXPECT_EQ(sim::estimate_profile("h200").intra_node.bytes_per_s, 450e9);
    const std::string msg = user_error_of([] { sim::estimate_profile("b200"); });
    EXPECT_NE(msg.find("no built-in estimate for 'b200'; the estimates are a100-80g, h100, h200"), std::string::npos)
        << msg;
}

// FLOPs by hand for GPT-2's ops, B = 2 sequences of T = 16, C = 48, NH = 4 (HS = 12), F = 4C, Vp = 128.
TEST(Profile, FlopsOfGptOps) {
    const GptShape s = small_gpt();
    const GptGraph gg = build_gpt_graph({.shape = s, .B = 2, .T = 16}, gpt_param_table(s));
    const graph::Graph& g = gg.g;
    const double N = 32, C = 48, F = 192, Vp = 128;
    auto work_of = [&](graph::OpCode op, const std::string& label) {
        for (const graph::Node& n : g.nodes)
            if (n.op == op && n.label == label) return sim::op_work(g, n);
        ADD_FAILURE() << "no " << graph::op_name(op) << " " << label << " in\n" << graph::describe(g);
        return sim::OpWork{};
    };
    using graph::OpCode;
    const sim::OpWork qkv = work_of(OpCode::kMatmul, "h.0.attn.c_attn");
    EXPECT_EQ(qkv.family, OpFamily::kMatmulForward);
    EXPECT_EQ(qkv.flops, 2 * N * C * 3 * C);
    EXPECT_EQ(qkv.bytes, 4 * (N * C + 3 * C * C + 3 * C + N * 3 * C));  // fp32 x, weight, bias in; qkv out
    EXPECT_EQ(qkv.epilogue_bytes, 0);
    const sim::OpWork fc = work_of(OpCode::kMatmulGelu, "h.0.mlp.c_fc");
    EXPECT_EQ(fc.flops, 2 * N * C * F);
    EXPECT_EQ(fc.epilogue_family, OpFamily::kActivationForward);  // the GELU: pre read, y written
    EXPECT_EQ(fc.epilogue_bytes, 4 * 2 * N * F);
    // c_proj's backward ends with the GELU's backward on its dx (N x F): pre and dx read, dpre written
    const sim::OpWork proj_back = work_of(OpCode::kMatmulBackward, "h.0.mlp.c_proj");
    EXPECT_EQ(proj_back.flops, 4 * N * F * C);  // dx and dW
    EXPECT_EQ(proj_back.epilogue_family, OpFamily::kActivationBackward);
    EXPECT_EQ(proj_back.epilogue_bytes, 4 * 3 * N * F);
    EXPECT_EQ(work_of(OpCode::kMatmulBackward, "h.0.mlp.c_fc").epilogue_bytes, 0);
    const sim::OpWork attn = work_of(OpCode::kAttention, "h.0.attn");
    EXPECT_EQ(attn.family, OpFamily::kAttentionForward);
    EXPECT_EQ(attn.flops, 2 * 2 * 16.0 * 16 * 48);  // 4 B T^2 C, halved by the mask
    EXPECT_EQ(work_of(OpCode::kAttentionBackward, "h.0.attn").flops, 2 * attn.flops);
    EXPECT_EQ(work_of(OpCode::kMatmul, "lm_head").flops, 2 * N * C * Vp);
    EXPECT_EQ(work_of(OpCode::kResidualLayerNorm, "h.0.ln_2").flops, 0);  // memory-bound: its bytes bound it
}

// The shapes a profile can hold an op measured at (OpShape), for the graph of FlopsOfGptOps and a Llama's: each
// dimension read off the graph by hand.
TEST(Profile, ShapesOfGptOps) {
    GptShape s = small_gpt();
    GptGraphSpec spec{.shape = s, .B = 2, .T = 16};
    spec.options.lm_head_loss_fusion = true;
    const GptGraph gg = build_gpt_graph(spec, gpt_param_table(s));
    auto key_of = [](const graph::Graph& g, graph::OpCode op, const std::string& label) -> std::string {
        for (const graph::Node& n : g.nodes) {
            if (n.op != op || (!label.empty() && n.label != label)) continue;
            const std::optional<sim::OpShape> shape = sim::op_shape(g, n);
            return shape ? shape->key() : "none";
        }
        ADD_FAILURE() << "no " << graph::op_name(op) << " " << label << " in\n" << graph::describe(g);
        return "";
    };
    using graph::OpCode;
    // N = B T = 32 rows; c_attn: K = C, M = 3C, with its bias
    EXPECT_EQ(key_of(gg.g, OpCode::kMatmul, "h.0.attn.c_attn"), "matmul_fwd 32x48x144x1");
    EXPECT_EQ(key_of(gg.g, OpCode::kMatmulGelu, "h.0.mlp.c_fc"), "matmul_fwd 32x48x192x1");  // the GELU is not in it
    // c_proj's backward: K = F, M = C, writing dx and its bias's gradient
    EXPECT_EQ(key_of(gg.g, OpCode::kMatmulBackward, "h.0.mlp.c_proj"), "matmul_bwd 32x192x48x1x1");
    EXPECT_EQ(key_of(gg.g, OpCode::kAttention, "h.0.attn"), "attention_fwd 2x16x4x4x12");  // B T NH NKV HS
    EXPECT_EQ(key_of(gg.g, OpCode::kAttentionBackward, "h.0.attn"), "attention_bwd 2x16x4x4x12");
    EXPECT_EQ(key_of(gg.g, OpCode::kLmHeadLoss, ""), "lm_head_loss 32x48x128x61");  // N C Vp and the valid V
    EXPECT_EQ(key_of(gg.g, OpCode::kResidualLayerNorm, "h.0.ln_2"), "none");        // memory-bound: the curves cost it

    s.arch = ModelArch::kLlama, s.NKV = 2, s.untied = true;
    spec = {.shape = s, .B = 2, .T = 16};
    const GptGraph gqa = build_llama_graph(spec, gpt_param_table(s));
    EXPECT_EQ(key_of(gqa.g, OpCode::kAttention, ""), "attention_fwd 2x16x4x2x12");
    spec.options.context_parallel = 2;
    spec.T = 8;
    const GptGraph ring = build_llama_graph(spec, gpt_param_table(s));
    EXPECT_EQ(key_of(ring.g, OpCode::kRingAttention, ""), "none");
}

// An op whose shape the table holds costs its measured seconds, plus its fused GELU at the curve's rate; the others
// cost the curves.
TEST(Profile, MeasuredShapesTakeOverTheCurves) {
    const GptShape s = small_gpt();
    const GptGraph gg = build_gpt_graph({.shape = s, .B = 2, .T = 16}, gpt_param_table(s));
    const graph::Graph& g = gg.g;
    auto node = [&](graph::OpCode op, const std::string& label) -> const graph::Node& {
        for (const graph::Node& n : g.nodes)
            if (n.op == op && n.label == label) return n;
        throw std::runtime_error("no " + label);
    };
    const graph::Node& fc = node(graph::OpCode::kMatmulGelu, "h.0.mlp.c_fc");
    const graph::Node& qkv = node(graph::OpCode::kMatmul, "h.0.attn.c_attn");
    const graph::Node& attn = node(graph::OpCode::kAttention, "h.0.attn");
    sim::Profile p = hand_profile({.overhead_s = 1e-6, .points = {{1, 1e9}}});
    p.tables[0].shape_seconds = {{"matmul_fwd 32x48x192x1", 0.25}, {"attention_fwd 2x16x4x4x12", 0.5}};
    const sim::ProfileCostModel m(p);
    EXPECT_EQ(m.op_seconds(g, attn), 0.5);
    EXPECT_DOUBLE_EQ(m.op_seconds(g, fc), 0.25 + 4.0 * 2 * 32 * 192 / 1e9);         // the GELU: pre read, y written
    EXPECT_EQ(m.op_seconds(g, qkv), m.seconds(sim::op_work(g, qkv), DType::kF32));  // not held
    p.tables[0].shape_seconds.clear();
    EXPECT_EQ(sim::ProfileCostModel(p).op_seconds(g, attn), m.seconds(sim::op_work(g, attn), DType::kF32));
}

// The fused LM head (forward and backward in one op), and a Llama's grouped-query and ring attention (4 query heads,
// 2 key/value heads, HS = 12; context parallelism of 2 holds T / 2 = 8 rows of each of the B = 2 sequences).
TEST(Profile, FlopsOfFusedHeadAndRingAttention) {
    GptShape s = small_gpt();
    GptGraphSpec spec{.shape = s, .B = 2, .T = 16};
    spec.options.lm_head_loss_fusion = true;
    const GptGraph fused = build_gpt_graph(spec, gpt_param_table(s));
    auto work_of = [](const graph::Graph& g, graph::OpCode op) {
        for (const graph::Node& n : g.nodes)
            if (n.op == op) return sim::op_work(g, n);
        ADD_FAILURE() << "no " << graph::op_name(op) << " in\n" << graph::describe(g);
        return sim::OpWork{};
    };
    const sim::OpWork head = work_of(fused.g, graph::OpCode::kLmHeadLoss);
    EXPECT_EQ(head.family, OpFamily::kLmHeadLoss);
    EXPECT_EQ(head.flops, 6.0 * 32 * 48 * 128);  // logits, dlnf and dwte: 2 N C Vp each

    s.arch = ModelArch::kLlama, s.NKV = 2, s.untied = true;
    spec = {.shape = s, .B = 2, .T = 16};
    const GptGraph gqa = build_llama_graph(spec, gpt_param_table(s));
    EXPECT_EQ(work_of(gqa.g, graph::OpCode::kAttention).flops, 2.0 * 2 * 16 * 16 * 4 * 12);  // the key/value heads
                                                                                             // do not count
    spec.options.context_parallel = 2;
    spec.T = 8;
    const GptGraph ring = build_llama_graph(spec, gpt_param_table(s));
    const sim::OpWork step = work_of(ring.g, graph::OpCode::kRingAttention);
    EXPECT_EQ(step.family, OpFamily::kAttentionForward);
    EXPECT_EQ(step.flops, 2.0 * 2 * 8 * 8 * 4 * 12);  // one step of the ring: causal attention over the local rows
    EXPECT_EQ(work_of(ring.g, graph::OpCode::kRingAttentionBackward).flops, 2 * step.flops);
}

// calibrate --quick measures every family and writes a profile the loader takes; a second dtype is refused by the
// cost model with the sentence.
TEST(Profile, CalibrateQuickWritesALoadableProfile) {
    TempDir dir("ms_calibrate");
    const std::string out = dir / "cpu.json";
    const std::string cmd = std::string(MS_BINARY_PATH) + " calibrate --quick --threads 1 --output " + out + " 2>&1";
    const ms::test::JobRun run = ms::test::run_command(cmd, "");
    const std::string& output = run.output;
    ASSERT_EQ(run.code, 0) << output;
    EXPECT_NE(output.find("matmul_fwd"), std::string::npos) << output;
    const sim::ProfileCostModel m(sim::load_profile(out));
    const sim::Profile& prof = m.profile();
    EXPECT_FALSE(prof.estimate);
    EXPECT_EQ(prof.backend, "cpu");
    EXPECT_EQ(prof.threads, 1);
    ASSERT_EQ(prof.tables.size(), 1u);
    for (size_t i = 0; i < sim::kNumFamilies; ++i)
        EXPECT_GE(prof.tables[0].families[i].points.size(), 1u) << sim::family_name(static_cast<OpFamily>(i));
    EXPECT_GT(m.peak_flops(DType::kF32), 0);
    EXPECT_NE(m.describe().find("measured"), std::string::npos) << m.describe();
    EXPECT_EQ(prof.cores, static_cast<int>(std::thread::hardware_concurrency()));
    // the link model's defaults, said so
    EXPECT_NE(prof.links_source.find("LinkModelConfig"), std::string::npos) << prof.links_source;
}

// calibrate --world-size times, each as itself, every shape the search and the config's own layout price on that
// many ranks (planned_op_shapes, on the curves the profile holds); without --config it says what is missing.
TEST(Profile, CalibrateWorldSizeTimesTheModelsShapes) {
    TempDir dir("ms_calibrate");
    const std::string out = dir / "cpu.json";
    const std::string config = MS_SOURCE_DIR "/tests/parallel/tiny.yaml";
    const std::string cmd = std::string(MS_BINARY_PATH) + " calibrate --quick --threads 1 --config " + config +
                            " --world-size 2 --output " + out + " 2>&1";
    const ms::test::JobRun run = ms::test::run_command(cmd, "");
    ASSERT_EQ(run.code, 0) << run.output;
    const sim::Profile prof = sim::load_profile(out);
    const std::vector<sim::OpShape> shapes =
        planned_op_shapes(load_config(config, {}), {2}, 0, sim::ProfileCostModel(prof), prof.device_memory_bytes);
    std::set<std::string> keys;
    for (const sim::OpShape& shape : shapes) keys.insert(shape.key());
    std::set<std::string> held;
    for (const auto& [key, seconds] : prof.tables.at(0).shape_seconds) {
        held.insert(key);
        EXPECT_GT(seconds, 0) << key;
    }
    EXPECT_EQ(held, keys);
    // tp 1 and 2, micro-batches 1, 2 and 4 (dp 2 of 8 sequences leaves 4 a rank at most): c_attn's forward at tp 2
    // and 4 sequences of 32 rows, the attention of one sequence over tp 1's 4 heads
    EXPECT_TRUE(keys.count("matmul_fwd 128x64x96x1")) << run.output;
    EXPECT_TRUE(keys.count("attention_bwd 1x32x4x4x16")) << run.output;
    EXPECT_NE(run.output.find("calibrate: the model's own op shapes for world sizes 2: " + std::to_string(keys.size())),
              std::string::npos)
        << run.output;

    // and the search on that profile finds every shape it prices measured
    const ms::test::JobRun search = ms::test::run_command(std::string(MS_BINARY_PATH) + " plan --config " + config +
                                                              " --world-size 2 --search --profile " + out + " 2>&1",
                                                          "");
    ASSERT_EQ(search.code, 0) << search.output;
    EXPECT_NE(search.output.find("op shapes: all " + std::to_string(keys.size()) +
                                 " matmul, attention and LM-head shapes priced as the profile measured them"),
              std::string::npos)
        << search.output;

    const ms::test::JobRun bare = ms::test::run_command(
        std::string(MS_BINARY_PATH) + " calibrate --quick --world-size 2 --output " + out + " 2>&1", "");
    EXPECT_NE(bare.code, 0);
    EXPECT_NE(bare.output.find("calibrate: --world-size measures the op shapes of a config's model, and no --config "
                               "was given"),
              std::string::npos)
        << bare.output;
}

}  // namespace
}  // namespace ms::test
