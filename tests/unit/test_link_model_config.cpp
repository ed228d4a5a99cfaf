// test_link_model_config.cpp: the keys of the link model and the node layout (run.ranks_per_node, link_model.*):
// their checks, each a sentence with the key, the value, the constraint and a hint, and their place in the config
// hash (config_to_yaml).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/core/check.h"

namespace ms {
namespace {

// A small valid model, then `extra`.
std::vector<std::string> small(std::vector<std::string> extra = {}) {
    std::vector<std::string> s = {"model.num_layers=2",     "model.hidden_size=64", "model.num_attention_heads=4",
                                  "model.seq_length=32",    "model.vocab_size=100", "training.micro_batch_size=2",
                                  "training.train_iters=10"};
    s.insert(s.end(), extra.begin(), extra.end());
    return s;
}

// The message of the UserError (exit code 2) f throws; "" (and a failure) when it throws none.
std::string config_error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const UserError& e) {
        EXPECT_EQ(e.exit_code(), kExitConfigError) << e.what();
        return e.what();
    }
    ADD_FAILURE() << "no UserError thrown";
    return "";
}

TEST(LinkModelConfig, RanksPerNodeMustDivideTheWorld) {
    const Config cfg = load_config("", small({"run.ranks_per_node=3"}));
    const std::string msg = config_error_of([&] { validate_config(cfg, 4); });
    EXPECT_NE(msg.find("run.ranks_per_node(3) does not divide the world size 4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hint: a divisor of 4, or 0 to take the nodes from the hosts"), std::string::npos) << msg;
    EXPECT_NO_THROW(validate_config(cfg, 6));
    EXPECT_NO_THROW(validate_config(load_config("", small({"run.ranks_per_node=2"})), 4));
    EXPECT_NO_THROW(validate_config(load_config("", small({"run.ranks_per_node=0"})), 3));  // by host
}

TEST(LinkModelConfig, ValuesOutOfRangeAreRefused) {
    std::string msg = config_error_of([] { load_config("", small({"run.ranks_per_node=-1"})); });
    EXPECT_NE(msg.find("run.ranks_per_node = -1 must be >= 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hint: 0 takes the nodes from the hosts"), std::string::npos) << msg;
    msg = config_error_of([] { load_config("", small({"link_model.inter_node_bandwidth_gbps=0"})); });
    EXPECT_NE(msg.find("link_model.inter_node_bandwidth_gbps = 0.0 must be > 0"), std::string::npos) << msg;
    msg = config_error_of([] { load_config("", small({"link_model.intra_node_latency_us=-5"})); });
    EXPECT_NE(msg.find("link_model.intra_node_latency_us = -5.0 must be >= 0"), std::string::npos) << msg;
}

TEST(LinkModelConfig, KeysAreInTheConfigHash) {
    const Config off = load_config("", small());
    EXPECT_FALSE(off.link_model.enabled);  // real runs use no model
    EXPECT_EQ(off.run.ranks_per_node, 0);
    const std::string yaml = config_to_yaml(off);
    for (const char* key : {"ranks_per_node: 0", "link_model:", "enabled: false", "intra_node_latency_us:",
                            "intra_node_bandwidth_gbps:", "inter_node_latency_us:", "inter_node_bandwidth_gbps:"}) {
        EXPECT_NE(yaml.find(key), std::string::npos) << key << " not in:\n" << yaml;
    }
    EXPECT_NE(config_hash(off), config_hash(load_config("", small({"link_model.enabled=true"}))));
    EXPECT_NE(config_hash(off), config_hash(load_config("", small({"run.ranks_per_node=1"}))));
}

}  // namespace
}  // namespace ms
