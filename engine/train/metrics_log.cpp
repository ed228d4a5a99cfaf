// metrics_log.cpp: trim_metrics_log (metrics_log.h).
#include "engine/train/metrics_log.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/ckpt/atomic_dir.h"
#include "engine/core/check.h"
#include "engine/core/log.h"

namespace ms {

namespace {

// The line's iteration, or -1 when it is not a JSON object with an integer "iteration" (a line torn by a crash).
int64_t iteration_of(const std::string& line) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return -1;
    const auto it = j.find("iteration");
    return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : -1;
}

}  // namespace

MetricsTrim trim_metrics_log(const std::string& path, int64_t last_iteration) {
    MetricsTrim trim;
    std::ifstream in(path);
    if (!in) return trim;
    std::string kept;
    for (std::string line; std::getline(in, line);) {
        const int64_t it = iteration_of(line);
        if (it >= 0 && it <= last_iteration) {
            kept += line;
            kept += '\n';
            ++trim.kept;
        } else {
            ++trim.dropped;
        }
    }
    in.close();
    if (trim.dropped > 0) write_file_atomic(path, kept);
    return trim;
}

std::ofstream open_metrics_log(const std::string& path, std::optional<int64_t> resumed_iteration) {
    const std::filesystem::path file(path);
    if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
    if (resumed_iteration) {
        const MetricsTrim trim = trim_metrics_log(path, *resumed_iteration);
        if (trim.dropped > 0)
            log_info("metrics: dropped {} line(s) of {} logged after iteration {} (they are trained again)",
                     trim.dropped, path, *resumed_iteration);
    }
    std::ofstream metrics(file, resumed_iteration ? std::ios::app : std::ios::trunc);
    if (!metrics) throw UserError(fmt::format("cannot write logging.metrics_file '{}'", path));
    return metrics;
}

}  // namespace ms
