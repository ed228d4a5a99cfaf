// job_run.h: run a trainer job (one process, or mpiexec) from a test, and read the run files it leaves in its
// run.output_dir (engine/train/reliability.h): exit_status/rank_XXXXX.json, comm_traces/, events.jsonl. Shared by
// the fault, exit-status and signal tests (tests/parallel).
#pragma once

#include <fmt/format.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace ms::test {

struct JobRun {
    int code = -1;  // the shell's view: exit code, or 128 + signal
    double seconds = 0;
    std::string output;  // what the command printed (give it 2>&1 for stderr too)
    std::string dir;     // its run.output_dir
};

// Runs `command` through the shell and waits for it; `dir` is the run.output_dir it was given.
inline JobRun run_command(const std::string& command, const std::string& dir) {
    JobRun r;
    r.dir = dir;
    const auto t0 = std::chrono::steady_clock::now();
    FILE* p = popen(command.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
    const int status = pclose(p);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return r;
}

// The JSON in `path`, or null when there is none (or it does not parse).
inline nlohmann::json read_json(const std::string& path) {
    std::ifstream f(path);
    if (!f) return nullptr;
    return nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
}

// exit_status/rank_XXXXX.json of `rank` in run directory `dir`, or null when that rank left none (it was killed).
inline nlohmann::json rank_status(const std::string& dir, int rank) {
    return read_json(fmt::format("{}/exit_status/rank_{:05d}.json", dir, rank));
}

}  // namespace ms::test
