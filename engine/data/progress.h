// progress.h: progress of a long phase on stderr (preprocess, convert, checkpoint save and load): a bar with rate and
// ETA redrawn in place when stderr is a terminal, a plain line every few seconds otherwise (a log file gets no carriage
// returns).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ms {

class Progress {
  public:
    enum class Style : uint8_t { kBar, kLines, kNone };
    // kBar when stderr is a terminal, else kLines.
    static Style style_for_stderr();
    // kBar when stderr is a terminal, else kNone: for phases whose log has its own summary line (checkpoint save and
    // load), so that a log file gets nothing more.
    static Style bar_or_none_for_stderr();

    // `total` bytes of input to get through; `label` starts every line; `items_name` counts the items.
    Progress(std::string label, int64_t total_bytes, Style style, std::string items_name = "documents");
    // `done` bytes of the input and `items` items so far; redraws when the style's interval has passed.
    void update(int64_t done_bytes, int64_t items);
    // The bar at 100% and a newline (kBar); nothing otherwise (the caller prints its summary).
    void finish();

    // One report: label, bar (kBar only), percent, bytes, rate, items, ETA, as it is printed.
    static std::string line(const std::string& label, Style style, int64_t done_bytes, int64_t total_bytes,
                            int64_t items, double seconds, const std::string& items_name = "documents");

  private:
    using Clock = std::chrono::steady_clock;
    std::string label_;
    int64_t total_;
    std::string items_name_;
    Style style_;
    Clock::time_point start_ = Clock::now(), last_ = start_;
    int64_t done_ = 0, items_ = 0;
    bool drawn_ = false;
};

}  // namespace ms
