#include "engine/core/check.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace ms {
namespace {
std::string g_context = "[rank 0/1]";
AbortHook g_abort_hook = nullptr;
}  // namespace

void set_error_context(const std::string& context) { g_context = context; }

std::string host_name() {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) != 0) return "?";
    return host;
}
void set_abort_hook(AbortHook hook) { g_abort_hook = hook; }

void fatal(const char* expr, const char* file, int line, const char* func, const std::string& msg) {
    char host[256] = "?";
    gethostname(host, sizeof(host) - 1);
    std::fflush(stdout);
    std::fprintf(stderr, "%s %s:%d fatal: %s\n    check: %s\n    at %s:%d (%s)\n", g_context.c_str(), host,
                 static_cast<int>(getpid()), msg.c_str(), expr, file, line, func);
    std::fflush(stderr);
    if (g_abort_hook) g_abort_hook(1);
    std::abort();
}

}  // namespace ms
