// check.h: the one family of error macros and the two kinds of error.
//
// - Programming errors / broken invariants: MS_CHECK(cond, fmt, ...) prints the expression, file:line,
//   function, rank and host, then ends the whole job through the installed abort hook (MPI_Abort once
//   comm/ is up; std::abort before). Never a lone exit() that leaves peers hanging.
// - User errors (bad config, bad data file): throw ms::UserError with a sentence that names what is wrong,
//   the value, the constraint and a hint. apps/main.cpp prints it and exits with its exit code
//   (kExitConfigError = 2) before anything is allocated.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace ms {

// Exit codes (README "Exit codes"): one table for the whole program.
inline constexpr int kExitOk = 0;
inline constexpr int kExitConfigError = 2;         // bad config, bad command line, missing/corrupt input data
inline constexpr int kExitSignal = 3;              // SIGTERM/SIGUSR1 seen at a step boundary (saved if configured)
inline constexpr int kExitNumerical = 17;          // NaN/Inf in a loss or gradient with reliability.nan_policy fail
inline constexpr int kExitCollectiveTimeout = 18;  // a collective waited longer than reliability.collective_timeout_s
inline constexpr int kExitCheckpoint = 19;

// A failure that ends the run with one of the exit codes above: apps/main.cpp prints what() and exits with
// exit_code(). UserError is the kind caused by the input; comm/communicator.h's CollectiveTimeoutError (18) and
// engine/train/reliability.h's NumericalError (17) are others.
class RunError : public std::runtime_error {
  public:
    RunError(const std::string& what, int exit_code) : std::runtime_error(what), exit_code_(exit_code) {}
    int exit_code() const { return exit_code_; }
    // Already printed to stderr where it was raised (before ranks agreed to stop): main() does not print it again.
    bool reported() const { return reported_; }
    void set_reported() { reported_ = true; }
    // The world rank whose failure this is, when another rank's (a config hash that differs, a data file missing
    // there): exit_status.json names it as the failing rank. -1: this rank's own.
    int failed_rank() const { return failed_rank_; }
    void set_failed_rank(int rank) { failed_rank_ = rank; }

  private:
    int exit_code_;
    bool reported_ = false;
    int failed_rank_ = -1;
};

// The length of the "<kind> error: " an error text starts with ("config error: ", "data error: "), else 0.
inline size_t error_kind_length(const std::string& what) {
    const size_t colon = what.find(": ");
    const std::string head = what.substr(0, colon == std::string::npos ? 0 : colon);
    const bool has_kind = head.size() >= 5 && head.size() <= 24 && head.compare(head.size() - 5, 5, "error") == 0 &&
                          head.find_first_not_of("abcdefghijklmnopqrstuvwxyz ") == std::string::npos;
    return has_kind ? colon + 2 : 0;
}

// The line an error is reported with: texts that already say what kind of error they are ("config error: ...",
// "data error: ...") as they are, others with the plain "error: " prefix.
inline std::string user_error_line(const std::string& what) {
    return error_kind_length(what) > 0 ? what : "error: " + what;
}

// The error text with where it happened after its kind: "data error: rank 1 (host h): cannot open ...". For errors
// that can differ between ranks (a file one node lacks), so the line names the rank that saw it.
inline std::string error_at(const std::string& what, const std::string& where) {
    const std::string line = user_error_line(what);
    const size_t kind = error_kind_length(line);
    return line.substr(0, kind) + where + ": " + line.substr(kind);
}

class UserError : public RunError {
  public:
    explicit UserError(const std::string& what, int exit_code = kExitConfigError) : RunError(what, exit_code) {}
};

// Context printed in front of every fatal message; comm/ fills in rank and coordinates once known.
void set_error_context(const std::string& context);
// This machine's host name ("?" when it cannot be read): how errors, logs and run files name a host.
std::string host_name();
using AbortHook = void (*)(int exit_code);
void set_abort_hook(AbortHook hook);

[[noreturn]] void fatal(const char* expr, const char* file, int line, const char* func, const std::string& msg);

}  // namespace ms

#define MS_CHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) ::ms::fatal(#cond, __FILE__, __LINE__, __func__, ::fmt::format(__VA_ARGS__)); \
    } while (0)

#define MS_UNREACHABLE(...) ::ms::fatal("unreachable", __FILE__, __LINE__, __func__, ::fmt::format(__VA_ARGS__))
