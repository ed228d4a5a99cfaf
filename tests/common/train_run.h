// train_run.h: run the trainer binary on a config and compare two runs the torchtitan way (test_equivalence.cpp):
// the full gradient of every parameter after step 1 (the trainer's MS_DUMP_GRADS hook, one dump per pipeline stage)
// and the losses of every step (metrics.jsonl). Shared by the trainer-on-a-backend tests: tests/gpu/
// test_gpu_train.cpp (the GPU against the CPU) and tests/e2e/test_train_cuda_emu.cpp (the CUDA kernels on the CPU
// emulation against the CPU). Header-only, with no engine dependency (test_gpu links neither ms_engine nor fmt).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"

namespace ms::test {

struct TrainRun {
    std::vector<double> losses;      // "lm loss" (CLIP's "contrastive loss", self-play's "loss") of every step
    std::vector<double> itm_losses;  // CLIP with cross-modal layers: "itm loss" of every step
    std::map<std::string, std::vector<float>> grads;       // name -> global tensor after step 1's backward
    int64_t skipped_iterations = -1, nan_iterations = -1;  // of the last record (cumulative counts)
    std::vector<double> loss_scales;                       // fp16 only: "loss-scale" after every step
    std::vector<int64_t> dp_bytes;                         // bytes rank 0 sent on dp in every step
    std::string output;                                    // stdout and stderr of the whole run
};

struct TrainCommand {
    std::string binary;    // the trainer
    std::string config;    // a YAML file
    std::string sets;      // further arguments, e.g. " --set run.backend=cuda"
    int ranks = 1;         // > 1: under `launcher -n ranks`
    std::string launcher;  // e.g. "mpiexec --oversubscribe --allow-run-as-root"
    std::string env;       // prepended to the command, e.g. "OMP_NUM_THREADS=1 "
    int timeout_s = 150;
    std::string command = "train";  // or "selfplay"
    std::string output_dir;         // run.output_dir when set (kept after the run); else a directory of its own
};

// Runs the command in a fresh directory (run.output_dir), expects exit status 0, and reads what it wrote.
inline TrainRun run_train(const TrainCommand& c) {
    const TempDir own("ms_train_run");
    const std::string dir = c.output_dir.empty() ? own.path() : c.output_dir;
    std::string cmd = "MS_DUMP_GRADS=" + dir + "/grads.bin " + c.env + " timeout " + std::to_string(c.timeout_s) + " ";
    if (c.ranks > 1) cmd += c.launcher + " -n " + std::to_string(c.ranks) + " ";
    cmd += "'" + c.binary + "' " + c.command + " --config '" + c.config + "' --set run.output_dir=" + dir + " " +
           c.sets + " 2>&1";
    TrainRun r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) {
        ADD_FAILURE() << "popen failed: " << cmd;
        return r;
    }
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
    const int status = pclose(p);
    EXPECT_EQ(status, 0) << cmd << "\n" << r.output;
    std::ifstream metrics(dir + "/metrics.jsonl");
    std::string line;
    while (std::getline(metrics, line)) {
        const auto j = nlohmann::json::parse(line);
        // a language model's step record, a CLIP model's (model.arch: clip) or a self-play iteration's; evaluation
        // records have none
        const char* key = j.contains("lm loss")            ? "lm loss"
                          : j.contains("contrastive loss") ? "contrastive loss"
                          : j.contains("policy loss")      ? "loss"
                                                           : nullptr;
        if (key == nullptr) continue;
        r.losses.push_back(j[key].is_number() ? j[key].get<double>() : std::nan(""));
        if (j.contains("itm loss")) r.itm_losses.push_back(j["itm loss"].get<double>());
        if (j.contains("skipped_iterations")) r.skipped_iterations = j["skipped_iterations"].get<int64_t>();
        if (j.contains("nan_iterations")) r.nan_iterations = j["nan_iterations"].get<int64_t>();
        if (j.contains("loss-scale")) r.loss_scales.push_back(j["loss-scale"].get<double>());
        if (j.contains("bytes_per_step")) r.dp_bytes.push_back(j["bytes_per_step"].value("dp", int64_t{0}));
    }
    for (int stage = 0;; ++stage) {  // one dump per pipeline stage; the tied wte is on the first and the last
        const std::string file = dir + "/grads.bin.stage" + std::to_string(stage);
        std::ifstream index_file(file + ".json");
        if (!index_file) break;
        std::ifstream bin(file, std::ios::binary);
        for (const auto& e : nlohmann::json::parse(index_file)) {
            int64_t numel = 1;
            for (int64_t d : e["shape"].get<std::vector<int64_t>>()) numel *= d;
            std::vector<float> g(static_cast<size_t>(numel));
            bin.seekg(e["offset"].get<int64_t>() * 4);
            bin.read(reinterpret_cast<char*>(g.data()), numel * 4);
            r.grads.emplace(e["name"].get<std::string>(), std::move(g));
        }
    }
    return r;
}

// Largest |a - b| over the first n entries relative to the largest |b| (scale-free: a gradient's scale, e.g. fp16's
// loss scale, cancels).
inline double rel_error(const std::vector<float>& a, const std::vector<float>& b, size_t n) {
    double max_diff = 0, max_ref = 0;
    n = std::min({n, a.size(), b.size()});
    for (size_t i = 0; i < n; ++i) {
        max_diff = std::max(max_diff, std::abs(static_cast<double>(a[i]) - b[i]));
        max_ref = std::max(max_ref, std::abs(static_cast<double>(b[i])));
    }
    return max_ref > 0 ? max_diff / max_ref : max_diff;
}

struct RunTolerances {
    double grad;  // per tensor, rel_error after step 1
    double loss;  // per step, |loss - base| / |base|
};

struct RunErrors {
    double worst_grad = 0, worst_loss = 0;
    std::string worst_name;
};

// Expects `r` to match `base`: the same parameters, every step-1 gradient within tol.grad, every loss of `steps`
// within tol.loss, and training (the last loss below the first). Prints the worst errors (a line the GPU check's
// summary greps: "<what> vs <base_name>: worst gradient error ..."). compared(name, numel) says how many leading
// entries of a gradient to compare (e.g. the real vocabulary's rows of a padded embedding); all by default.
inline RunErrors expect_run_matches(const TrainRun& r, const TrainRun& base, size_t steps, RunTolerances tol,
                                    const std::string& what, const std::string& base_name,
                                    const std::function<size_t(const std::string&, size_t)>& compared = {}) {
    RunErrors e;
    EXPECT_EQ(base.losses.size(), steps) << base.output;
    EXPECT_EQ(r.losses.size(), steps) << r.output;
    EXPECT_FALSE(base.grads.empty()) << base.output;
    EXPECT_EQ(r.grads.size(), base.grads.size()) << r.output;
    if (r.losses.size() != steps || base.losses.size() != steps || base.grads.empty()) return e;
    for (const auto& [name, g] : base.grads) {
        const auto it = r.grads.find(name);
        if (it == r.grads.end()) {
            ADD_FAILURE() << what << ": no gradient for " << name;
            continue;
        }
        const double err = rel_error(it->second, g, compared ? compared(name, g.size()) : g.size());
        if (std::isnan(err) || (err > e.worst_grad && !std::isnan(e.worst_grad)))
            e.worst_grad = err, e.worst_name = name;
        EXPECT_LE(err, tol.grad) << what << ": " << name;
    }
    for (size_t i = 0; i < steps; ++i) {
        const double err = std::abs(r.losses[i] - base.losses[i]) / std::abs(base.losses[i]);
        if (std::isnan(err) || (err > e.worst_loss && !std::isnan(e.worst_loss))) e.worst_loss = err;
        EXPECT_LE(err, tol.loss) << what << ": step " << i + 1 << " " << r.losses[i] << " vs " << base.losses[i];
    }
    std::printf(
        "%s vs %s: worst gradient error %.3g (%s; tolerance %.1g), worst loss error %.3g (tolerance %.1g) "
        "over %zu steps; losses %.7f .. %.7f\n",
        what.c_str(), base_name.c_str(), e.worst_grad, e.worst_name.c_str(), tol.grad, e.worst_loss, tol.loss, steps,
        r.losses.front(), r.losses.back());
    std::fflush(stdout);
    EXPECT_LT(r.losses.back(), r.losses.front()) << what;  // it trains
    return e;
}

}  // namespace ms::test
