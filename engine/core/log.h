// log.h: rank-aware logging. log_info prints on the logging rank only (rank 0 for now); log_warn everywhere.
#pragma once

#include <fmt/format.h>

#include <string>

namespace ms {

void set_log_rank(int rank, bool is_logging_rank);
bool is_logging_rank();
void log_line(const std::string& line);   // stdout, logging rank only, flushed
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
