// metrics_log.h: keeping logging.metrics_file (metrics.jsonl) one line per event when a run resumes.
//
// A run that dies after its last checkpoint has already logged the iterations past it; the resumed run trains them
// again and logs them again. Before a resume appends, trim_metrics_log keeps exactly the lines of iterations up to the
// checkpoint's (the ones the resumed run will not repeat) and drops the rest, including a line torn by the crash, so
// every iteration appears once and in order -- as Megatron's TensorBoard writer gets by purging steps past the load.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

namespace ms {

struct MetricsTrim {
    int64_t kept = 0;
    int64_t dropped = 0;  // lines past `last_iteration`, or not a JSON object with an integer "iteration"
};

// Rewrites `path` (atomically: a crash leaves the old or the new file) with its lines whose "iteration" is at most
// last_iteration. A missing file is an empty one; nothing is written when nothing is dropped.
MetricsTrim trim_metrics_log(const std::string& path, int64_t last_iteration);

// Opens the metrics log `path` (logging.metrics_file, on the writing rank) to write, its folder created: from empty
// for a fresh run, appended after trim_metrics_log for a run resumed at `resumed_iteration` (the lines dropped are
// logged). Throws UserError, naming the file, when it cannot be written.
std::ofstream open_metrics_log(const std::string& path, std::optional<int64_t> resumed_iteration);

}  // namespace ms
