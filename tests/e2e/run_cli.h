// run_cli.h: run the built mindspeed-train binary from an e2e test and capture its exit code and output.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace ms::test {

struct CliResult {
    int exit_code = -1;
    std::string output;  // stdout and stderr, interleaved
};

inline CliResult run_cli(const std::string& args) {
    const std::string cmd = std::string("OMP_NUM_THREADS=2 '") + MS_BINARY_PATH + "' " + args + " 2>&1";
    CliResult r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    std::array<char, 4096> buf{};
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
    const int status = pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

// The same with stdout alone in `output` and stderr in `errors`: for commands whose stdout is their result.
struct CliStreams {
    int exit_code = -1;
    std::string output, errors;
};
inline CliStreams run_cli_streams(const std::string& args) {
    char err_path[] = "/tmp/ms-e2e-stderr-XXXXXX";
    const int fd = mkstemp(err_path);
    if (fd < 0) return {};
    close(fd);
    const std::string cmd = std::string("OMP_NUM_THREADS=2 '") + MS_BINARY_PATH + "' " + args + " 2>'" + err_path + "'";
    CliStreams r;
    FILE* p = popen(cmd.c_str(), "r");
    if (p != nullptr) {
        std::array<char, 4096> buf{};
        size_t n;
        while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
        const int status = pclose(p);
        r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::ifstream f(err_path);
    std::stringstream ss;
    ss << f.rdbuf();
    r.errors = ss.str();
    std::remove(err_path);
    return r;
}

inline std::string make_temp_dir() {
    char tmpl[] = "/tmp/ms-e2e-XXXXXX";
    const char* d = mkdtemp(tmpl);
    return d ? std::string(d) : std::string();
}

inline std::string read_file(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

}  // namespace ms::test
