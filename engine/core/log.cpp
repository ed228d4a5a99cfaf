#include "engine/core/log.h"

#include <cstdio>

namespace ms {
namespace {
bool g_logging_rank = true;
int g_rank = 0;
std::FILE* g_log_stream = stdout;
}  // namespace

void set_log_rank(int rank, bool logging) {
    g_rank = rank;
    g_logging_rank = logging;
}
bool is_logging_rank() { return g_logging_rank; }
void set_log_stream(LogStream stream) { g_log_stream = stream == LogStream::kStderr ? stderr : stdout; }
void log_line(const std::string& line) {
    std::fwrite(line.data(), 1, line.size(), g_log_stream);
    std::fputc('\n', g_log_stream);
    std::fflush(g_log_stream);
}
void warn_line(const std::string& line) { std::fprintf(stderr, "[rank %d] warning: %s\n", g_rank, line.c_str()); }

}  // namespace ms
