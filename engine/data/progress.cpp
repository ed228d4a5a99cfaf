// progress.cpp: Progress (progress.h) -- the report line, and when to print it.
#include "engine/data/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "engine/data/file_source.h"

namespace ms {
namespace {

constexpr double kBarInterval = 0.1;   // seconds between redraws of a terminal's bar
constexpr double kLineInterval = 5.0;  // seconds between plain lines
constexpr int kBarWidth = 30;          // characters of the bar itself

std::string clock_time(double seconds) {
    const auto s = static_cast<int64_t>(seconds + 0.5);
    if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
    return fmt::format("{}:{:02}", s / 60, s % 60);
}

}  // namespace

Progress::Style Progress::style_for_stderr() { return isatty(STDERR_FILENO) ? Style::kBar : Style::kLines; }
Progress::Style Progress::bar_or_none_for_stderr() { return isatty(STDERR_FILENO) ? Style::kBar : Style::kNone; }

Progress::Progress(std::string label, int64_t total_bytes, Style style, std::string items_name)
    : label_(std::move(label)), total_(total_bytes), items_name_(std::move(items_name)), style_(style) {}

std::string Progress::line(const std::string& label, Style style, int64_t done_bytes, int64_t total_bytes,
                           int64_t items, double seconds, const std::string& items_name) {
    const double fraction =
        total_bytes > 0 ? std::clamp(static_cast<double>(done_bytes) / static_cast<double>(total_bytes), 0.0, 1.0)
                        : 1.0;
    const double rate = seconds > 0 ? static_cast<double>(done_bytes) / seconds : 0.0;
    const std::string eta =
        rate > 0 ? clock_time(static_cast<double>(std::max<int64_t>(total_bytes - done_bytes, 0)) / rate) : "?";
    const std::string numbers = fmt::format("{:5.1f}%  {} / {}  {}/s  {} {}  ETA {}", 100.0 * fraction,
                                            data::human_bytes(static_cast<uint64_t>(done_bytes)),
                                            data::human_bytes(static_cast<uint64_t>(total_bytes)),
                                            data::human_bytes(static_cast<uint64_t>(rate)), items, items_name, eta);
    if (style != Style::kBar) return fmt::format("{}: {}", label, numbers);
    const auto filled = static_cast<int>(fraction * kBarWidth);
    return fmt::format("{} [{}{}] {}", label, std::string(static_cast<size_t>(filled), '#'),
                       std::string(static_cast<size_t>(kBarWidth - filled), '.'), numbers);
}

void Progress::update(int64_t done_bytes, int64_t items) {
    done_ = done_bytes;
    items_ = items;
    if (style_ == Style::kNone) return;
    const Clock::time_point now = Clock::now();
    const double since_last = std::chrono::duration<double>(now - last_).count();
    if (since_last < (style_ == Style::kBar ? kBarInterval : kLineInterval)) return;
    last_ = now;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const std::string text = line(label_, style_, done_, total_, items_, seconds, items_name_);
    if (style_ == Style::kBar) {
        std::fprintf(stderr, "\r%s\x1b[K", text.c_str());  // \x1b[K clears what a longer previous line left
        drawn_ = true;
    } else {
        std::fprintf(stderr, "%s\n", text.c_str());
    }
    std::fflush(stderr);
}

void Progress::finish() {
    if (style_ != Style::kBar) return;
    const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    std::fprintf(stderr, "%s%s\x1b[K\n", drawn_ ? "\r" : "",
                 line(label_, style_, total_, total_, items_, seconds, items_name_).c_str());
    std::fflush(stderr);
}

}  // namespace ms
