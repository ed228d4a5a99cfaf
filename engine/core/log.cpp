#include "engine/core/log.h"

#include <cstdio>

namespace ms {
namespace {
bool g_logging_rank = true;
int g_rank = 0;
}  // namespace

void set_log_rank(int rank, bool logging) {
    g_rank = rank;
    g_logging_rank = logging;
}
bool is_logging_rank() { return g_logging_rank; }
void log_line(const std::string& line) {
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
}
void warn_line(const std::string& line) { std::fprintf(stderr, "[rank %d] warning: %s\n", g_rank, line.c_str()); }

}  // namespace ms
