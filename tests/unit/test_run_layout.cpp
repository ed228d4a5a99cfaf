// test_run_layout.cpp: RunLayout (engine/train/run_layout.h) -- every derived number of a few layouts against the
// arithmetic written out here, the parsed enums, the Topology it carries, the one validation (a bad layout is the
// validation's sentence), and the vocabulary resolution.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/core/check.h"
#include "engine/data/dataset.h"
#include "engine/train/run_layout.h"

namespace {

using ms::Config;
using ms::RunLayout;

Config small(std::vector<std::string> extra = {}) {
    std::vector<std::string> s = {"model.num_layers=4",     "model.hidden_size=64", "model.num_attention_heads=4",
                                  "model.seq_length=32",    "model.vocab_size=100", "training.micro_batch_size=2",
                                  "training.train_iters=10"};
    s.insert(s.end(), extra.begin(), extra.end());
    return ms::load_config("", s);
}

std::string layout_error(const Config& cfg, int world) {
    try {
        ms::make_run_layout(cfg, world);
    } catch (const ms::UserError& e) {
        return e.what();
    }
    ADD_FAILURE() << "no UserError";
    return "";
}

TEST(RunLayout, OneRankDefaults) {
    const RunLayout l = ms::make_run_layout(small(), 1);
    EXPECT_EQ(l.backend, ms::BackendKind::kCPU);
    EXPECT_EQ(l.comm, ms::parse_comm_kind(small().run.comm));
    EXPECT_EQ(l.dtype, ms::DType::kF32);
    EXPECT_EQ(l.schedule, ms::ScheduleKind::k1F1B);
    EXPECT_EQ(l.world_size(), 1);
    EXPECT_EQ((ms::Coord{l.tp(), l.dp(), l.pp()}), (ms::Coord{1, 1, 1}));
    EXPECT_EQ(l.virtual_stages, 1);
    EXPECT_EQ(l.layers_per_chunk, 4);
    EXPECT_EQ(l.num_microbatches, 1);  // global_batch_size 0 -> micro_batch_size * dp
    EXPECT_EQ(l.global_batch, 2);
    EXPECT_EQ(l.tokens_per_step(), 2 * 32);
    EXPECT_EQ(l.shape.V, 100);
    EXPECT_EQ(l.shape.Vp, 128);  // ceil(100 / 128) * 128
    EXPECT_EQ(l.shape.F, 256);
    EXPECT_EQ(l.shape.L, 4);
    EXPECT_EQ(l.shape.seq(), 32);
    // V_p*C + T*C + L*(12*C*C + 13*C) + 2*C
    const int64_t C = 64, L = 4;
    EXPECT_EQ(l.num_parameters, 128 * C + 32 * C + L * (12 * C * C + 13 * C) + 2 * C);
}

TEST(RunLayout, ThreeAxesAndTheInterleavedSchedule) {
    // world 16 = tp 2 x pp 2 x dp 4; 32 samples per step = 2 per micro-batch x 4 micro-batches x dp 4
    const Config cfg =
        small({"parallel.tensor_model_parallel_size=2", "parallel.pipeline_model_parallel_size=2",
               "parallel.pipeline_schedule=interleaved_1f1b", "parallel.virtual_pipeline_model_parallel_size=2",
               "training.global_batch_size=32", "mixed_precision.dtype=bf16", "parallel.zero_stage=1"});
    const RunLayout l = ms::make_run_layout(cfg, 16);
    EXPECT_EQ((ms::Coord{l.tp(), l.dp(), l.pp()}), (ms::Coord{2, 4, 2}));
    EXPECT_EQ(l.topology.world(), 16);
    EXPECT_EQ(l.schedule, ms::ScheduleKind::kInterleaved1F1B);
    EXPECT_EQ(l.dtype, ms::DType::kBF16);
    EXPECT_EQ(l.zero_stage, 1);
    EXPECT_EQ(l.virtual_stages, 2);
    EXPECT_EQ(l.layers_per_chunk, 1);  // 4 layers / (pp 2 * v 2)
    EXPECT_EQ(l.num_microbatches, 4);
    EXPECT_EQ(l.global_batch, 32);
    EXPECT_EQ(l.tokens_per_step(), 32 * 32);
    EXPECT_EQ(l.shape.Vp, 256);  // a multiple of 128 * tp
    // The layout's topology is the one the process groups are split by: rank 5 is (tp 1, dp 2, pp 0).
    EXPECT_EQ(l.topology.coord_of(5), (ms::Coord{1, 2, 0}));
    EXPECT_EQ(l.topology.embedding_group(5), (std::vector<int>{5, 13}));
}

TEST(RunLayout, ABadLayoutIsTheValidationsSentence) {
    const std::string e =
        layout_error(small({"parallel.tensor_model_parallel_size=2", "parallel.pipeline_model_parallel_size=2"}), 6);
    EXPECT_NE(e.find("config error: parallel.tensor_model_parallel_size(2) * pipeline_model_parallel_size(2) = 4 "
                     "does not divide the world size 6; hint: "),
              std::string::npos)
        << e;
    const std::string m =
        layout_error(small({"parallel.pipeline_model_parallel_size=2", "parallel.pipeline_schedule=interleaved_1f1b",
                            "parallel.virtual_pipeline_model_parallel_size=2", "model.num_layers=8",
                            "training.global_batch_size=6", "training.micro_batch_size=2"}),
                     2);
    EXPECT_NE(m.find("interleaved_1f1b schedule needs the number of micro-batches (3) to be a multiple of "
                     "pipeline_model_parallel_size(2)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("use 2 or 4 micro-batches"), std::string::npos) << m;
    EXPECT_NE(layout_error(small(), 0).find("the world size must be >= 1, got 0"), std::string::npos);
}

TEST(RunLayout, BackendNames) {
    EXPECT_EQ(ms::parse_backend_kind("cpu"), ms::BackendKind::kCPU);
    EXPECT_EQ(ms::parse_backend_kind("cuda"), ms::BackendKind::kCUDA);
}

TEST(RunLayout, VocabularyComesFromTheDataWhenUnset) {
    Config cfg = small({"model.vocab_size=0", "data.synthetic.vocab_size=77"});
    const std::unique_ptr<ms::TokenSource> source = ms::open_token_source(cfg.data, 0);
    EXPECT_EQ(ms::resolve_vocab(cfg, *source).model.vocab_size, source->vocab_size());
    cfg.model.vocab_size = 500;  // larger than the data needs: kept
    EXPECT_EQ(ms::resolve_vocab(cfg, *source).model.vocab_size, 500);
    cfg.model.vocab_size = 10;  // smaller than the data's tokens: refused
    try {
        ms::resolve_vocab(cfg, *source);
        ADD_FAILURE() << "no UserError";
    } catch (const ms::UserError& e) {
        EXPECT_NE(std::string(e.what()).find("model.vocab_size(10) is smaller than the data's largest token id + 1"),
                  std::string::npos)
            << e.what();
    }
}

}  // namespace
