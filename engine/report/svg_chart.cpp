// svg_chart.cpp: line charts, bar charts and the heatmap as SVG text (svg_chart.h).
//
// A chart is a fixed-size viewBox: the plot area sits inside margins that hold the tick labels, the axis titles and
// the chart title; data coordinates map linearly onto it (y upwards).
#include "engine/report/svg_chart.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "memory/arena.h"

namespace ms::report {

namespace {

constexpr double kWidth = 520, kHeight = 300;
constexpr double kLeft = 72, kRight = 16, kTop = 34, kBottom = 48;
constexpr double kLegendRow = 16;  // a line chart with several series has its legend in a row above the plot

struct Range {
    double lo = 0, hi = 1;
};

// Maps [lo, hi] of the data onto [a, b] of the picture.
double scale(double v, Range r, double a, double b) { return a + (v - r.lo) / (r.hi - r.lo) * (b - a); }

// The finite values' range, widened when it is a single value so that the axis has a length.
Range data_range(const std::vector<double>& values, bool from_zero) {
    Range r{std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
    for (double v : values) {
        if (!std::isfinite(v)) continue;
        r.lo = std::min(r.lo, v);
        r.hi = std::max(r.hi, v);
    }
    if (!std::isfinite(r.lo)) return {0, 1};
    if (from_zero) r.lo = std::min(r.lo, 0.0);
    if (r.hi == r.lo) {
        const double pad = r.lo == 0 ? 1 : std::abs(r.lo) * 0.1;
        r.hi += pad;
        if (!from_zero || r.lo != 0) r.lo -= pad;
    }
    return r;
}

std::string text(double x, double y, const std::string& cls, const std::string& anchor, const std::string& s,
                 const std::string& extra = "") {
    return fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" class=\"{}\" text-anchor=\"{}\"{}>{}</text>\n", x, y, cls,
                       anchor, extra, escape(s));
}

// The frame every chart shares: the opening tag, the title and the axis titles.
std::string open_chart(const std::string& id, const std::string& title, double width, double height) {
    return fmt::format(
               "<svg id=\"{}\" class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {:.0f} {:.0f}\" "
               "width=\"{:.0f}\" height=\"{:.0f}\" role=\"img\" aria-label=\"{}\">\n",
               escape(id), width, height, width, height, escape(title)) +
           text(width / 2, 20, "title", "middle", title);
}

std::string axis_labels(const std::string& x_label, const std::string& y_label, double plot_x0, double plot_x1,
                        double plot_y0, double plot_y1) {
    std::string s = text((plot_x0 + plot_x1) / 2, kHeight - 8, "axis-label", "middle", x_label);
    if (!y_label.empty()) {
        const double cy = (plot_y0 + plot_y1) / 2;
        s += text(14, cy, "axis-label", "middle", y_label, fmt::format(" transform=\"rotate(-90 14 {:.1f})\"", cy));
    }
    return s;
}

// Ticks for a byte axis: round numbers of the largest binary unit (KiB, MiB, ...) the top value reaches, printed
// without decimals where they have none ("2 MiB", not "2.00 MiB").
std::vector<double> byte_ticks(double hi) {
    double unit = 1;
    while (hi / unit >= 1024 && unit < 0x1p40) unit *= 1024;
    std::vector<double> ticks = nice_ticks(0, hi / unit);
    for (double& t : ticks) t *= unit;
    return ticks;
}

std::string byte_tick_label(double v) {
    static constexpr std::array<const char*, 5> kUnits = {"B", "KiB", "MiB", "GiB", "TiB"};
    size_t u = 0;
    while (v >= 1024 && u + 1 < kUnits.size()) v /= 1024, ++u;
    return fmt::format("{:g} {}", v, kUnits[u]);
}

// The x axis's ticks for iterations: whole numbers.
std::vector<double> integer_ticks(Range r) {
    std::vector<double> ticks = nice_ticks(r.lo, r.hi);
    if (ticks.size() > 1 && ticks[1] - ticks[0] < 1) ticks = nice_ticks(std::floor(r.lo), std::floor(r.lo) + 1, 1);
    return ticks;
}

// The indices of a series' points that are drawn: all of them up to kMaxDrawn; beyond, a long run's points are put in
// kBuckets buckets of x and each bucket keeps its lowest and highest point (in x order), so that a spike survives, and
// one non-finite point when it has any (the line breaks there). x is increasing (iterations).
std::vector<size_t> drawn_points(const Series& s, Range xr) {
    constexpr size_t kMaxDrawn = 2000, kBuckets = 1000;
    std::vector<size_t> out;
    const size_t n = s.x.size();
    if (n <= kMaxDrawn) {
        for (size_t i = 0; i < n; ++i) out.push_back(i);
        return out;
    }
    auto bucket = [&](size_t i) {
        return std::min(kBuckets - 1, static_cast<size_t>(std::max(0.0, scale(s.x[i], xr, 0, kBuckets))));
    };
    for (size_t i = 0; i < n;) {
        const size_t b = bucket(i);
        size_t lo = n, hi = n, gap = n;
        for (; i < n && bucket(i) == b; ++i) {
            if (!std::isfinite(s.y[i])) {
                gap = i;
            } else {
                if (lo == n || s.y[i] < s.y[lo]) lo = i;
                if (hi == n || s.y[i] > s.y[hi]) hi = i;
            }
        }
        if (lo != n) out.push_back(std::min(lo, hi));
        if (lo != n && hi != lo) out.push_back(std::max(lo, hi));
        if (gap != n) out.push_back(gap);
    }
    return out;
}

// Sequential colour scale (viridis' end points and three stops between), t in [0, 1].
std::string sequential_colour(double t) {
    static constexpr std::array<std::array<double, 3>, 5> kStops = {
        {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}}};
    t = std::clamp(t, 0.0, 1.0) * (kStops.size() - 1);
    const size_t i = std::min(static_cast<size_t>(t), kStops.size() - 2);
    const double f = t - static_cast<double>(i);
    std::array<int, 3> c{};
    for (size_t k = 0; k < 3; ++k)
        c[k] = static_cast<int>(std::lround(kStops[i][k] + f * (kStops[i + 1][k] - kStops[i][k])));
    return fmt::format("#{:02x}{:02x}{:02x}", c[0], c[1], c[2]);
}

}  // namespace

std::string format_value(double v, ValueFormat format) {
    if (!std::isfinite(v)) return "n/a";
    switch (format) {
        case ValueFormat::kBytes:
            return format_bytes(static_cast<size_t>(std::max(0.0, std::round(v))));
        case ValueFormat::kSi: {
            const double a = std::abs(v);
            if (a >= 1e9) return fmt::format("{:.3g}G", v / 1e9);
            if (a >= 1e6) return fmt::format("{:.3g}M", v / 1e6);
            if (a >= 1e3) return fmt::format("{:.3g}k", v / 1e3);
            return fmt::format("{:.3g}", v);
        }
        case ValueFormat::kPlain:
            break;
    }
    return fmt::format("{:.4g}", v);
}

std::string escape(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&quot;";
                break;
            default:
                out += c;
        }
    }
    return out;
}

std::vector<double> nice_ticks(double lo, double hi, int target_count) {
    if (!(hi > lo)) hi = lo + 1;
    const double raw = (hi - lo) / std::max(target_count, 1);
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag;
    for (double m : {1.0, 2.0, 5.0, 10.0}) {
        step = m * mag;
        if (step >= raw) break;
    }
    std::vector<double> ticks;
    const double first = std::floor(lo / step + 1e-9) * step;
    for (int i = 0;; ++i) {
        const double t = first + i * step;
        ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);  // no "-0"
        if (t >= hi - step * 1e-9) break;
    }
    return ticks;
}

std::string render_line_chart(const LineChart& c) {
    std::vector<double> xs, ys;
    for (const Series& s : c.series) {
        xs.insert(xs.end(), s.x.begin(), s.x.end());
        ys.insert(ys.end(), s.y.begin(), s.y.end());
    }
    const std::vector<double> x_ticks = integer_ticks(data_range(xs, false));
    const Range y_data = data_range(ys, c.y_from_zero);
    const std::vector<double> y_ticks = nice_ticks(y_data.lo, y_data.hi);
    const Range xr{x_ticks.front(), x_ticks.back()}, yr{y_ticks.front(), y_ticks.back()};
    const bool legend = c.series.size() > 1;
    const double x0 = kLeft, x1 = kWidth - kRight, y0 = kHeight - kBottom, y1 = kTop + (legend ? kLegendRow + 6 : 0);

    std::string s = open_chart(c.id, c.title, kWidth, kHeight);
    double legend_x = x0;
    for (double t : y_ticks) {
        const double y = scale(t, yr, y0, y1);
        s += fmt::format("<line class=\"grid\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>\n", x0, y, x1,
                         y);
        s += text(x0 - 6, y + 4, "tick", "end", format_value(t, c.y_format));
    }
    for (double t : x_ticks) {
        const double x = scale(t, xr, x0, x1);
        s += fmt::format("<line class=\"tick-mark\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>\n", x, y0,
                         x, y0 + 5);
        s += text(x, y0 + 18, "tick", "middle", format_value(t, ValueFormat::kSi));
    }
    s += fmt::format("<path class=\"axis\" d=\"M{:.1f} {:.1f} V{:.1f} H{:.1f}\"/>\n", x0, y1, y0, x1);
    s += axis_labels(c.x_label, c.y_label, x0, x1, y0, y1);

    for (size_t k = 0; k < c.series.size(); ++k) {
        const Series& sr = c.series[k];
        int finite = 0;
        for (double v : sr.y) finite += std::isfinite(v) ? 1 : 0;
        // one polyline per run of finite points; points alone (or few) also get a marker
        std::string points;
        auto flush = [&] {
            if (points.empty()) return;
            s += fmt::format(
                "<polyline class=\"series\" data-series=\"{}\" data-points=\"{}\" fill=\"none\" stroke=\"{}\" "
                "points=\"{}\"/>\n",
                escape(sr.name), finite, sr.colour, points);
            points.clear();
        };
        for (size_t i : drawn_points(sr, xr)) {
            if (!std::isfinite(sr.y[i])) {
                flush();
                continue;
            }
            const double px = scale(sr.x[i], xr, x0, x1), py = scale(sr.y[i], yr, y0, y1);
            points += fmt::format("{}{:.1f},{:.1f}", points.empty() ? "" : " ", px, py);
            if (finite <= 40) {
                s += fmt::format(
                    "<circle class=\"marker\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"><title>{} at "
                    "{}: {}</title></circle>\n",
                    px, py, sr.colour, escape(sr.name), format_value(sr.x[i], ValueFormat::kPlain),
                    format_value(sr.y[i], c.y_format));
            }
        }
        flush();
        if (legend) {  // key and name, left to right
            s += fmt::format(
                "<rect class=\"legend-key\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"3\" fill=\"{}\"/>\n",
                legend_x, kTop + 2, sr.colour);
            s += text(legend_x + 16, kTop + 6, "legend", "start", sr.name);
            legend_x += 30 + 6.2 * static_cast<double>(sr.name.size());  // about 6 px per character at 11 px
        }
    }
    return s + "</svg>\n";
}

std::string render_bar_chart(const BarChart& c) {
    constexpr double kBarHeight = 26, kGap = 14, kLabelWidth = 80, kRightRoom = 30;  // room for the last tick's label
    const double height = kTop + static_cast<double>(c.bars.size()) * (kBarHeight + kGap) + kBottom;
    std::vector<double> values;
    for (const Bar& b : c.bars) values.push_back(b.value);
    const double top = data_range(values, true).hi;
    const std::vector<double> ticks = c.format == ValueFormat::kBytes ? byte_ticks(top) : nice_ticks(0, top);
    const Range xr{ticks.front(), ticks.back()};
    const double x0 = kLeft + kLabelWidth, x1 = kWidth - kRight - kRightRoom, y0 = height - kBottom;

    std::string s = open_chart(c.id, c.title, kWidth, height);
    for (double t : ticks) {
        const double x = scale(t, xr, x0, x1);
        s += fmt::format("<line class=\"grid\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\"/>\n", x, kTop, x,
                         y0);
        s += text(x, y0 + 18, "tick", "middle",
                  c.format == ValueFormat::kBytes ? byte_tick_label(t) : format_value(t, c.format));
    }
    for (size_t i = 0; i < c.bars.size(); ++i) {
        const Bar& b = c.bars[i];
        const double y = kTop + kGap / 2 + static_cast<double>(i) * (kBarHeight + kGap);
        s += text(x0 - 8, y + kBarHeight / 2 + 4, "bar-label", "end", b.name);
        s += fmt::format(
            "<rect class=\"bar\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.0f}\" fill=\"{}\"><title>{}: "
            "{}</title></rect>\n",
            x0, y, scale(std::max(b.value, 0.0), xr, x0, x1) - x0, kBarHeight, b.colour, escape(b.name),
            format_value(b.value, c.format));
    }
    s += fmt::format("<path class=\"axis\" d=\"M{:.1f} {:.1f} V{:.1f} H{:.1f}\"/>\n", x0, kTop, y0, x1);
    s += text((x0 + x1) / 2, height - 8, "axis-label", "middle", c.x_label);
    return s + "</svg>\n";
}

std::string render_heatmap(const Heatmap& m) {
    const size_t n = m.values.size();
    constexpr double kPlot = 360, kLegendWidth = 110;
    const double cell = kPlot / static_cast<double>(std::max<size_t>(n, 1));
    const double x0 = kLeft, y0 = kTop + 8, width = x0 + kPlot + kLegendWidth, height = y0 + kPlot + kBottom;
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    for (const auto& row : m.values) {
        for (double v : row) {
            if (v > 0) lo = std::min(lo, v), hi = std::max(hi, v);
        }
    }
    const bool any = hi > 0;
    const bool log_scale = any && hi / lo > 100;
    const double legend_lo = log_scale ? lo : 0;  // a linear scale starts at 0
    auto position = [&](double v) {               // where v sits on the colour scale, in [0, 1]
        if (!any || hi == legend_lo) return 1.0;
        return log_scale ? std::log(v / lo) / std::log(hi / lo) : v / hi;
    };

    std::string s = open_chart(m.id, m.title, width, height);
    const size_t label_every = n <= 16 ? 1 : (n + 7) / 8;  // at most about 8 labels per axis
    for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < n; ++j) {
            const double v = m.values[i][j];
            s += fmt::format(
                "<rect class=\"cell\" data-row=\"{}\" data-col=\"{}\" data-value=\"{:.0f}\" x=\"{:.2f}\" y=\"{:.2f}\" "
                "width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\"><title>{} {} -> {} {}: {}</title></rect>\n",
                i, j, v, x0 + static_cast<double>(j) * cell, y0 + static_cast<double>(i) * cell, cell, cell,
                v > 0 ? sequential_colour(position(v)) : "#eeeeee", escape(m.row_label), i, escape(m.col_label), j,
                format_value(v, m.format));
        }
        if (i % label_every == 0) {
            const double mid = static_cast<double>(i) * cell + cell / 2;
            s += text(x0 - 6, y0 + mid + 4, "tick", "end", std::to_string(i));
            s += text(x0 + mid, y0 + kPlot + 16, "tick", "middle", std::to_string(i));
        }
    }
    s += text(x0 + kPlot / 2, height - 8, "axis-label", "middle", m.col_label);
    const double cy = y0 + kPlot / 2;
    s += text(14, cy, "axis-label", "middle", m.row_label, fmt::format(" transform=\"rotate(-90 14 {:.1f})\"", cy));

    // legend: the colour scale as a column of bands, largest value on top, with its end values
    const double lx = x0 + kPlot + 24, steps = 32, band = kPlot * 0.8 / steps;
    s += "<g class=\"legend-scale\">\n";
    for (int k = 0; k < static_cast<int>(steps); ++k) {
        const double t = 1.0 - (k + 0.5) / steps;
        s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.2f}\" width=\"16\" height=\"{:.2f}\" fill=\"{}\"/>\n", lx,
                         y0 + k * band, band + 0.3, sequential_colour(t));
    }
    s += "</g>\n";
    s += text(lx + 20, y0 + 10, "legend", "start", any ? format_value(hi, m.format) : "0");
    s += text(lx + 20, y0 + kPlot * 0.8, "legend", "start", format_value(any ? legend_lo : 0, m.format));
    s += text(lx, y0 + kPlot * 0.8 + 20, "legend", "start", log_scale ? "log scale" : "linear scale");
    s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"16\" height=\"10\" fill=\"#eeeeee\"/>\n", lx,
                     y0 + kPlot * 0.8 + 32);
    s += text(lx + 20, y0 + kPlot * 0.8 + 41, "legend", "start", "none");
    return s + "</svg>\n";
}

}  // namespace ms::report
