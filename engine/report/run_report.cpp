// run_report.cpp: the HTML page of `mindspeed-train report` (run_report.h), from the run files to the charts of
// svg_chart.h.
#include "engine/report/run_report.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/check.h"
#include "engine/report/svg_chart.h"

namespace ms::report {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Series colours (colour-blind safe: Okabe and Ito's palette).
constexpr const char* kBlue = "#0072b2";
constexpr const char* kOrange = "#e69f00";
constexpr const char* kGreen = "#009e73";
constexpr const char* kRed = "#d55e00";
constexpr const char* kPurple = "#cc79a7";

struct RunFiles {
    std::string dir, name, metrics_path;
    std::vector<json> train;  // metrics.jsonl records with "lm loss" (one per log interval)
    std::vector<json> valid;  // records with "validation lm loss"
    // `selfplay` runs: iteration records ("policy loss") and evaluation matches (keys "vs <opponent>")
    std::vector<json> selfplay, matches;
    int64_t unreadable = 0;  // lines that are not JSON objects with an "iteration" (a line torn by a crash)
    json matrix;             // comm_matrix.json, or null
    json exit_status;        // exit_status.json, or null
};

json read_json(const fs::path& path) {
    std::ifstream f(path);
    if (!f) return nullptr;
    return json::parse(f, nullptr, /*allow_exceptions=*/false);
}

// The run's name and its metrics file's path as config.resolved.yaml gives them; empty when it does not.
std::pair<std::string, std::string> resolved_config(const fs::path& dir) {
    try {
        const YAML::Node cfg = YAML::LoadFile((dir / "config.resolved.yaml").string());
        const YAML::Node name = cfg["run"]["name"], metrics = cfg["logging"]["metrics_file"];
        return {name ? name.as<std::string>() : "", metrics ? metrics.as<std::string>() : ""};
    } catch (const YAML::Exception&) {
        return {};
    }
}

RunFiles read_run(const std::string& run_dir) {
    RunFiles r;
    r.dir = run_dir;
    const fs::path dir(run_dir);
    if (!fs::is_directory(dir)) {
        throw UserError(fmt::format(
            "report error: run directory '{}' does not exist\n---> HINT: pass the run.output_dir of a training run "
            "(`mindspeed-train train --config FILE` writes it; configs/demo.yaml's is runs/demo)",
            run_dir));
    }
    std::string configured;
    std::tie(r.name, configured) = resolved_config(dir);
    r.metrics_path = (dir / "metrics.jsonl").string();
    if (!fs::exists(r.metrics_path) && !configured.empty() && fs::exists(configured)) r.metrics_path = configured;
    std::ifstream in(r.metrics_path);
    if (!in) {
        throw UserError(fmt::format(
            "report error: {} does not exist, so there is nothing to report on\n---> HINT: metrics.jsonl is what "
            "`mindspeed-train train` writes into run.output_dir at every log interval (logging.metrics_file); run "
            "`mindspeed-train train --config configs/demo.yaml --set run.output_dir={}` or pass the directory a run "
            "wrote",
            r.metrics_path, run_dir));
    }
    for (std::string line; std::getline(in, line);) {
        json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (!j.is_object() || !j.contains("iteration")) {
            ++r.unreadable;
        } else if (j.contains("lm loss")) {
            r.train.push_back(std::move(j));
        } else if (j.contains("validation lm loss")) {
            r.valid.push_back(std::move(j));
        } else if (j.contains("policy loss")) {
            r.selfplay.push_back(std::move(j));
        } else if (std::any_of(j.items().begin(), j.items().end(),
                               [](const auto& kv) { return kv.key().starts_with("vs "); })) {
            r.matches.push_back(std::move(j));
        }
    }
    r.matrix = read_json(dir / "comm_matrix.json");
    r.exit_status = read_json(dir / "exit_status.json");
    return r;
}

// `key` of a record times `factor`, NaN when it is absent or null.
double value(const json& record, const char* key, double factor = 1) {
    const auto it = record.find(key);
    return it != record.end() && it->is_number() ? it->get<double>() * factor : kNaN;
}

Series series(const std::vector<json>& records, const char* key, std::string name, const char* colour,
              double factor = 1) {
    Series s{std::move(name), {}, {}, colour};
    for (const json& r : records) {
        s.x.push_back(value(r, "iteration"));
        s.y.push_back(value(r, key, factor));
    }
    return s;
}

bool any_finite(const Series& s) {
    return std::any_of(s.y.begin(), s.y.end(), [](double v) { return std::isfinite(v); });
}

std::string missing(const std::string& id, const std::string& sentence) {
    return fmt::format("<p class=\"missing\" id=\"missing-{}\">{}</p>\n", id, escape(sentence));
}

// The middle value of the finite ones (NaN when none): a rate over intervals, robust to the first one's warm-up.
double median(std::vector<double> v) {
    v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
    if (v.empty()) return kNaN;
    std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
    return v[v.size() / 2];
}

std::string summary_row(const std::string& name, const std::string& v) {
    return fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", escape(name), escape(v));
}

std::string summary(const RunFiles& r) {
    std::string s = "<table class=\"summary\">\n";
    s += summary_row("run directory", r.dir);
    if (!r.name.empty()) s += summary_row("run name", r.name);
    s += summary_row(
        "metrics",
        fmt::format("{} ({} log intervals, {} validations{})", r.metrics_path, r.train.size(), r.valid.size(),
                    r.unreadable > 0 ? fmt::format(", {} unreadable lines", r.unreadable) : std::string()));
    if (!r.train.empty()) {
        const json& last = r.train.back();
        s += summary_row("last iteration", format_value(value(last, "iteration"), ValueFormat::kPlain));
        s += summary_row("last lm loss", format_value(value(last, "lm loss"), ValueFormat::kPlain));
        const Series tps = series(r.train, "tokens_per_sec", "", "");
        const Series mfu = series(r.train, "mfu", "", "", 100);
        s += summary_row("tokens/s (median)", format_value(median(tps.y), ValueFormat::kSi));
        s += summary_row("MFU (median)", fmt::format("{:.2f}%", median(mfu.y)));
    }
    if (!r.valid.empty()) {
        s += summary_row("last validation loss",
                         format_value(value(r.valid.back(), "validation lm loss"), ValueFormat::kPlain));
    }
    if (!r.selfplay.empty()) {
        s += summary_row("self-play iterations",
                         format_value(value(r.selfplay.back(), "iteration"), ValueFormat::kPlain));
        if (!r.matches.empty()) {
            const json& last = r.matches.back();
            for (const auto& kv : last.items()) {
                if (!kv.key().starts_with("vs ")) continue;
                s += summary_row(
                    "last evaluation " + kv.key(),
                    fmt::format("won {} drew {} lost {} (iteration {}, {} board)", kv.value().value("wins", 0),
                                kv.value().value("draws", 0), kv.value().value("losses", 0),
                                last.value("iteration", int64_t{0}), last.value("board", std::string())));
            }
        }
    }
    if (r.matrix.is_object()) s += summary_row("world size", std::to_string(r.matrix.value("world_size", 0)));
    if (r.exit_status.is_object()) {
        s += summary_row("exit", fmt::format("code {} at iteration {} ({}): {}", r.exit_status.value("code", -1),
                                             r.exit_status.value("iteration", int64_t{-1}),
                                             r.exit_status.value("time", std::string()),
                                             r.exit_status.value("reason", std::string())));
    }
    return s + "</table>\n";
}

std::string loss_section(const RunFiles& r) {
    LineChart c{"chart-loss", "Loss", "iteration", "lm loss", {}, ValueFormat::kPlain, false};
    c.series.push_back(series(r.train, "lm loss", "training", kBlue));
    std::string notes;
    if (r.valid.empty()) {
        notes = missing("validation",
                        "No validation loss: the run logged none (eval.eval_interval is 0, or the data split has no "
                        "validation share).");
    } else {
        c.series.push_back(series(r.valid, "validation lm loss", "validation", kOrange));
    }
    return "<section id=\"loss\"><h2>Loss</h2>\n" + render_line_chart(c) + notes + "</section>\n";
}

// One chart of one key of `records`, in a section of its own.
std::string line_section_of(const std::vector<json>& records, const std::string& id, const std::string& title,
                            const char* key, const std::string& y_label, const char* colour, ValueFormat format,
                            double factor = 1) {
    const LineChart c{"chart-" + id, title, "iteration", y_label, {series(records, key, y_label, colour, factor)},
                      format,        true};
    return "<section id=\"" + id + "\"><h2>" + escape(title) + "</h2>\n" + render_line_chart(c) + "</section>\n";
}
// ... of the training records.
std::string line_section(const RunFiles& r, const std::string& id, const std::string& title, const char* key,
                         const std::string& y_label, const char* colour, ValueFormat format, double factor = 1) {
    return line_section_of(r.train, id, title, key, y_label, colour, format, factor);
}

// A self-play run (`mindspeed-train selfplay`): its losses, the evaluation matches' win rate per opponent, and the
// search's throughput.
std::string selfplay_sections(const RunFiles& r) {
    LineChart loss{"chart-selfplay-loss", "Self-play loss", "iteration", "loss", {}, ValueFormat::kPlain, true};
    loss.series.push_back(series(r.selfplay, "loss", "total", kBlue));
    loss.series.push_back(series(r.selfplay, "policy loss", "policy", kOrange));
    loss.series.push_back(series(r.selfplay, "value loss", "value", kGreen));
    LineChart wins{
        "chart-win-rate", "Evaluation: win rate", "iteration", "games won (%)", {}, ValueFormat::kPlain, true};
    const char* colours[] = {kBlue, kRed, kPurple, kGreen, kOrange};
    std::vector<std::string> opponents;
    for (const json& m : r.matches)
        for (const auto& kv : m.items())
            if (kv.key().starts_with("vs ") &&
                std::find(opponents.begin(), opponents.end(), kv.key()) == opponents.end())
                opponents.push_back(kv.key());
    for (size_t i = 0; i < opponents.size(); ++i) {
        Series w{opponents[i], {}, {}, colours[i % std::size(colours)]};
        for (const json& m : r.matches) {
            w.x.push_back(value(m, "iteration"));
            const auto it = m.find(opponents[i]);
            w.y.push_back(it != m.end() ? value(*it, "win rate", 100) : kNaN);
        }
        wins.series.push_back(std::move(w));
    }
    std::string s = "<div class=\"row\">\n<section id=\"selfplay-loss\"><h2>Self-play loss</h2>\n" +
                    render_line_chart(loss) + "</section>\n<section id=\"win-rate\"><h2>Evaluation matches</h2>\n";
    if (r.matches.empty()) {
        s += missing("win-rate",
                     "No evaluation matches in metrics.jsonl (selfplay.eval_interval is 0 and the run "
                     "ended before its last iteration).");
    } else {
        s += render_line_chart(wins);
        s += "<p class=\"note\">The agent's share of games won against each opponent, half of them with each "
             "colour; the board is the curriculum stage's at that iteration.</p>\n";
    }
    s += "</section>\n</div>\n<div class=\"row\">\n" +
         line_section_of(r.selfplay, "selfplay-throughput", "Search throughput", "positions evaluated per second",
                         "positions evaluated/s", kBlue, ValueFormat::kSi) +
         "</div>\n";
    return s;
}

std::string communication_section(const RunFiles& r) {
    LineChart c{"chart-comm", "Pipeline bubble and communication",
                "iteration",  "% of step time (mean over ranks)",
                {},           ValueFormat::kPlain,
                true};
    // total first: exposed communication is part of it, and is drawn over it
    c.series.push_back(series(r.train, "total_comm", "total communication", kBlue, 100));
    c.series.push_back(series(r.train, "exposed_comm", "exposed communication", kRed, 100));
    c.series.push_back(series(r.train, "pipeline_bubble", "pipeline bubble", kOrange, 100));
    std::string s = "<section id=\"communication\"><h2>Pipeline bubble and communication</h2>\n";
    if (std::none_of(c.series.begin(), c.series.end(), any_finite)) {
        return s + missing("comm-shares", "No pipeline bubble or communication shares in metrics.jsonl.") +
               "</section>\n";
    }
    s += render_line_chart(c);
    s += "<p class=\"note\">Exposed: the time ranks waited in tensor-, data- and model-parallel collectives. Total: "
         "those operations' time from issue to completion, overlapped or not. Bubble: the time waited in pipeline "
         "sends and receives.</p>\n";
    return s + "</section>\n";
}

std::string memory_section(const RunFiles& r) {
    std::string s = "<section id=\"memory\"><h2>Memory: plan and arena peak (rank 0)</h2>\n";
    std::optional<json> rec;
    for (const json& j : r.train) {
        if (value(j, "memory_planned_bytes") > 0) rec = j;
    }
    if (!rec) {
        return s + missing("memory", "No memory_planned_bytes in metrics.jsonl (written by runs of this version).") +
               "</section>\n";
    }
    const double planned = value(*rec, "memory_planned_bytes"), peak = value(*rec, "memory_peak_bytes");
    const BarChart c{"chart-memory",
                     "Arena: planned vs peak",
                     "bytes",
                     {{"planned", planned, kBlue}, {"arena peak", peak, peak > planned ? kRed : kGreen}},
                     ValueFormat::kBytes};
    s += render_bar_chart(c);
    s += fmt::format("<p class=\"note\">The arena's peak after the first step is {:.2f}% of the plan.</p>\n",
                     100.0 * peak / planned);
    return s + "</section>\n";
}

std::string group_table(const json& by_group) {
    std::string s = "<table class=\"groups\"><tr><th>group</th><th>bytes</th><th>seconds</th></tr>\n";
    for (const auto& [group, total] : by_group.items()) {
        s += fmt::format("<tr><td>{}</td><td>{}</td><td>{:.4f}</td></tr>\n", escape(group),
                         format_value(total.value("bytes", 0.0), ValueFormat::kBytes), total.value("seconds", 0.0));
    }
    return s + "</table>\n";
}

std::string matrix_section(const RunFiles& r) {
    std::string s = "<section id=\"comm-matrix\"><h2>Communication matrix</h2>\n";
    if (!r.matrix.is_object()) {
        return s +
               missing("comm-matrix",
                       "No comm_matrix.json: rank 0 writes it when training ends normally, so this run stopped early "
                       "(see the exit line above) or ran with an older version.") +
               "</section>\n";
    }
    const int W = r.matrix.value("world_size", 0);
    if (W <= 1) {
        return s + missing("comm-matrix", "One rank: no communication between ranks to show.") + "</section>\n";
    }
    Heatmap m{"comm-heatmap", "Bytes sent, all groups", "source rank", "destination rank", {}, ValueFormat::kBytes};
    m.values.assign(static_cast<size_t>(W), std::vector<double>(static_cast<size_t>(W), 0.0));
    for (const json& p : r.matrix.value("pairs", json::array())) {
        const int src = p.value("src", -1), dst = p.value("dst", -1);
        if (src < 0 || dst < 0 || src >= W || dst >= W) continue;
        m.values[static_cast<size_t>(src)][static_cast<size_t>(dst)] += p.value("bytes", 0.0);
    }
    s += "<div class=\"row\">\n" + render_heatmap(m) + group_table(r.matrix.value("by_group", json::object())) +
         "</div>\n";
    const std::string nodes = r.matrix.value("node_layout", std::string());
    if (!nodes.empty()) s += fmt::format("<p class=\"note\">Ranks: {}.</p>\n", escape(nodes));
    return s + "</section>\n";
}

constexpr const char* kStyle = R"(
body { font-family: sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 22px; margin-bottom: 8px; }
h2 { font-size: 17px; margin: 24px 0 8px; border-bottom: 1px solid #ddd; }
.row { display: flex; flex-wrap: wrap; gap: 0 24px; align-items: flex-start; }
section { max-width: 1100px; }
.row > section { width: 522px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { text-align: left; padding: 3px 10px; border-bottom: 1px solid #eee; }
.missing { color: #8a4b00; background: #fff6e5; padding: 6px 10px; border-left: 3px solid #e69f00; }
.note { color: #555; font-size: 13px; max-width: 900px; }
svg.chart { background: #fff; border: 1px solid #e4e4e4; }
svg .title { font-size: 14px; font-weight: bold; fill: #222; }
svg .axis-label { font-size: 12px; fill: #333; }
svg .tick, svg .legend, svg .bar-label { font-size: 11px; fill: #444; }
svg .axis { stroke: #333; fill: none; }
svg .grid { stroke: #ececec; }
svg .tick-mark { stroke: #333; }
svg polyline.series { stroke-width: 1.8; }
)";

}  // namespace

std::string render_run_report(const std::string& run_dir) {
    const RunFiles r = read_run(run_dir);
    const std::string title = "mindspeed-train report: " + (r.name.empty() ? r.dir : r.name);
    std::string page = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
                       escape(title) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n<h1>" +
                       escape(title) + "</h1>\n";
    page += summary(r);
    if (!r.selfplay.empty()) {
        page += selfplay_sections(r);
    } else if (r.train.empty()) {
        page += missing("training",
                        "metrics.jsonl has no training records (\"lm loss\"): the run ended before its "
                        "first log interval.");
    } else {
        page += "<div class=\"row\">\n" + loss_section(r) +
                line_section(r, "lr", "Learning rate", "learning-rate", "learning rate", kGreen, ValueFormat::kPlain) +
                "</div>\n<div class=\"row\">\n" +
                line_section(r, "throughput", "Throughput", "tokens_per_sec", "tokens/s", kBlue, ValueFormat::kSi) +
                line_section(r, "mfu", "Model FLOPs utilisation", "mfu", "MFU (% of peak)", kPurple,
                             ValueFormat::kPlain, 100) +
                "</div>\n<div class=\"row\">\n" + communication_section(r) + memory_section(r) + "</div>\n";
    }
    page += matrix_section(r);
    return page + "</body>\n</html>\n";
}

}  // namespace ms::report
