// log.h: rank-aware logging. log_info prints on the logging rank only (rank 0 for now), to stdout unless a command
// whose stdout is its result (`eval --json`, `generate`) sends it to stderr; log_warn everywhere, to stderr.
#pragma once

#include <fmt/format.h>

#include <string>

namespace ms {

enum class LogStream { kStdout, kStderr };

void set_log_rank(int rank, bool is_logging_rank);
bool is_logging_rank();
void set_log_stream(LogStream stream);    // where log_line writes (kStdout at start)
void log_line(const std::string& line);   // the log stream, logging rank only, flushed
void warn_line(const std::string& line);  // stderr, every rank, prefixed "warning: "

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
    if (is_logging_rank()) log_line(fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
    warn_line(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace ms
