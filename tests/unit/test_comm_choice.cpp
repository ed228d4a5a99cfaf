// test_comm_choice.cpp: run.comm -- parse, the config errors, and the resolution of auto (comm/nccl/comm_choice.h),
// plus validate_config's run.comm block. CPU only: nothing here needs NCCL or a GPU (tests/gpu/test_nccl.cpp runs the
// communicator itself).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/nccl/comm_choice.h"
#include "engine/config/config.h"
#include "engine/core/check.h"

namespace {

using ms::comm_config_error;
using ms::CommKind;
using ms::resolve_comm;

TEST(CommChoice, ParsesTheThreeNames) {
    EXPECT_EQ(ms::parse_comm_kind("auto"), CommKind::kAuto);
    EXPECT_EQ(ms::parse_comm_kind("mpi"), CommKind::kMpi);
    EXPECT_EQ(ms::parse_comm_kind("nccl"), CommKind::kNccl);
    for (CommKind k : {CommKind::kAuto, CommKind::kMpi, CommKind::kNccl})
        EXPECT_EQ(ms::parse_comm_kind(ms::comm_kind_name(k)), k);
}

TEST(CommChoice, AutoPicksNcclOnlyOnCudaWithNcclAndAGpuPerRank) {
    EXPECT_EQ(resolve_comm(CommKind::kAuto, "cuda", true, true).kind, CommKind::kNccl);
    EXPECT_EQ(resolve_comm(CommKind::kAuto, "cpu", true, true).kind, CommKind::kMpi);
    EXPECT_EQ(resolve_comm(CommKind::kAuto, "cuda", false, true).kind, CommKind::kMpi);
    EXPECT_EQ(resolve_comm(CommKind::kAuto, "cuda", true, false).kind, CommKind::kMpi);  // ranks share a GPU
    // The reason names what decided, for the start-up log.
    EXPECT_NE(resolve_comm(CommKind::kAuto, "cuda", false, true).reason.find("no NCCL"), std::string::npos);
    EXPECT_NE(resolve_comm(CommKind::kAuto, "cuda", true, false).reason.find("share a GPU"), std::string::npos);
    EXPECT_NE(resolve_comm(CommKind::kAuto, "cpu", true, true).reason.find("run.backend: cpu"), std::string::npos);
}

TEST(CommChoice, MpiIsAlwaysMpi) {
    for (const char* backend : {"cpu", "cuda"})
        for (bool nccl : {false, true})
            for (bool own : {false, true})
                EXPECT_EQ(resolve_comm(CommKind::kMpi, backend, nccl, own).kind, CommKind::kMpi);
}

TEST(CommChoice, ExplicitNcclEitherRunsOrSaysWhy) {
    EXPECT_EQ(resolve_comm(CommKind::kNccl, "cuda", true, true).kind, CommKind::kNccl);
    auto user_error = [](CommKind k, const char* backend, bool nccl, bool own) -> std::string {
        try {
            resolve_comm(k, backend, nccl, own);
        } catch (const ms::UserError& e) {
            EXPECT_EQ(e.exit_code(), ms::kExitConfigError);
            return e.what();
        }
        return "";
    };
    EXPECT_NE(user_error(CommKind::kNccl, "cpu", true, true).find("needs run.backend = 'cuda', got 'cpu'"),
              std::string::npos);
    EXPECT_NE(user_error(CommKind::kNccl, "cuda", false, true).find("built without NCCL"), std::string::npos);
    const std::string shared = user_error(CommKind::kNccl, "cuda", true, false);
    EXPECT_NE(shared.find("a GPU of its own for every rank"), std::string::npos) << shared;
    EXPECT_NE(shared.find("hint: launch at most one rank per GPU"), std::string::npos) << shared;
}

TEST(CommChoice, ConfigErrorsOnlyForNccl) {
    for (const char* backend : {"cpu", "cuda"}) {
        for (bool nccl : {false, true}) {
            EXPECT_EQ(comm_config_error(CommKind::kAuto, backend, nccl), "");
            EXPECT_EQ(comm_config_error(CommKind::kMpi, backend, nccl), "");
        }
    }
    EXPECT_EQ(comm_config_error(CommKind::kNccl, "cuda", true), "");
    const std::string cpu = comm_config_error(CommKind::kNccl, "cpu", true);
    EXPECT_NE(cpu.find("hint: set run.backend: cuda, or run.comm: mpi"), std::string::npos) << cpu;
    const std::string no_nccl = comm_config_error(CommKind::kNccl, "cuda", false);
    EXPECT_NE(no_nccl.find("this binary was built without NCCL"), std::string::npos) << no_nccl;
    EXPECT_NE(no_nccl.find("hint:"), std::string::npos) << no_nccl;
}

// Through validate_config, in this binary (no CUDA backend, no NCCL registered): nccl on the CPU is refused with
// its own sentence; auto and mpi pass; an unknown name is the schema's error.
TEST(CommChoice, ValidateConfig) {
    const std::vector<std::string> small = {
        "model.num_layers=2",   "model.hidden_size=64",        "model.num_attention_heads=4", "model.seq_length=32",
        "model.vocab_size=100", "training.micro_batch_size=2", "training.train_iters=10"};
    auto with = [&](const std::string& set) {
        std::vector<std::string> s = small;
        s.push_back(set);
        return ms::load_config("", s);
    };
    EXPECT_NO_THROW(ms::validate_config(with("run.comm=auto"), 1));
    EXPECT_NO_THROW(ms::validate_config(with("run.comm=mpi"), 1));
    EXPECT_EQ(ms::load_config("", small).run.comm, "auto");  // the default
    try {
        ms::validate_config(with("run.comm=nccl"), 1);
        ADD_FAILURE() << "run.comm: nccl on the CPU backend validated";
    } catch (const ms::UserError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("config error: run.comm = 'nccl' needs run.backend = 'cuda', got 'cpu'"), std::string::npos)
            << msg;
    }
    try {
        ms::load_config("", {"run.comm=gloo"});
        ADD_FAILURE() << "run.comm: gloo loaded";
    } catch (const ms::UserError& e) {
        EXPECT_NE(std::string(e.what()).find("run.comm = 'gloo' must be one of: auto, mpi, nccl"), std::string::npos)
            << e.what();
    }
}

}  // namespace
