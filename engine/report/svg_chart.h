// svg_chart.h: the charts of `mindspeed-train report` as inline SVG text -- line charts, horizontal bars and a
// heatmap, each with axes, ticks, labels and a legend, in one <svg id="..."> element that needs no script, style
// sheet or font from outside (the page's own <style> colours the text).
//
// Element classes a reader (or a test) can count: every chart is <svg id="<id>" class="chart">; its axis titles are
// <text class="axis-label">, its tick labels <text class="tick">; a line series is one or more <polyline
// class="series" data-series="<name>" data-points="<n>"> (n: the series' finite points, all drawn unless there are
// thousands: then each bucket of x draws its lowest and highest); a bar is <rect class="bar">; a heatmap cell
// is <rect class="cell" data-row data-col data-value>, one per (row, column), each with a <title> tooltip.
#pragma once

#include <string>
#include <vector>

namespace ms::report {

// How tick labels and tooltips print a value.
enum class ValueFormat {
    kPlain,  // 3.5, 0.0012, 1.5e-05
    kSi,     // 12.5k, 3M
    kBytes,  // 1.50 MiB
};

std::string format_value(double v, ValueFormat format);
// Text for HTML and SVG: & < > " escaped.
std::string escape(const std::string& text);

// Ticks that are round numbers (1, 2 or 5 times a power of ten) covering [lo, hi]: the first is <= lo, the last >= hi.
std::vector<double> nice_ticks(double lo, double hi, int target_count = 5);

struct Series {
    std::string name;
    std::vector<double> x, y;  // same length; a non-finite y breaks the line
    std::string colour;        // CSS colour
};

struct LineChart {
    std::string id, title, x_label, y_label;
    std::vector<Series> series;
    ValueFormat y_format = ValueFormat::kPlain;
    bool y_from_zero = false;  // the y axis starts at 0 (rates, shares); else it fits the data
};

struct Bar {
    std::string name;
    double value = 0;
    std::string colour;
};

struct BarChart {
    std::string id, title, x_label;
    std::vector<Bar> bars;
    ValueFormat format = ValueFormat::kPlain;
};

// A square matrix of non-negative values: rows and columns are both indexed 0..n-1 (ranks).
struct Heatmap {
    std::string id, title, row_label, col_label;
    std::vector<std::vector<double>> values;  // (n, n)
    ValueFormat format = ValueFormat::kPlain;
};

std::string render_line_chart(const LineChart& chart);
std::string render_bar_chart(const BarChart& chart);
// Zero cells are grey; the others take a sequential colour scale, logarithmic when the non-zero values span more
// than two orders of magnitude (the legend says which).
std::string render_heatmap(const Heatmap& map);

}  // namespace ms::report
