// test_report.cpp: `mindspeed-train report RUN_DIR` end to end. One real 2-rank run (tests/parallel/tiny.yaml with
// pp 2 and a validation every 3 iterations) and its page, checked twice: in the HTML text (runs everywhere), and in
// the DOM headless Chromium builds and lays out (Debian's chromium; skipped with a message where it is not
// installed) -- every chart's <svg> with its id and axis labels, the loss series with one point per log interval,
// the heatmap with world_size^2 cells holding comm_matrix.json's bytes. Inputs a run may lack (validation, a
// matrix, a second rank) give a page that says so; a directory without metrics.jsonl is an error sentence.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/report/svg_chart.h"
#include "tests/common/job_run.h"
#include "tests/common/temp_dir.h"
#include "tests/e2e/run_cli.h"

namespace ms {
namespace {

using nlohmann::json;

// The charts every page of a run with training records has, with their axis titles.
const std::map<std::string, std::vector<std::string>> kLineCharts = {
    {"chart-loss", {"iteration", "lm loss"}},
    {"chart-lr", {"iteration", "learning rate"}},
    {"chart-throughput", {"iteration", "tokens/s"}},
    {"chart-mfu", {"iteration", "MFU (% of peak)"}},
    {"chart-comm", {"iteration", "% of step time (mean over ranks)"}},
};

size_t count(const std::string& text, const std::string& needle) {
    size_t n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
    return n;
}

// The text of the <svg id="id" ...> ... </svg> element, or "" when the page has none.
std::string svg_element(const std::string& html, const std::string& id) {
    const size_t begin = html.find("<svg id=\"" + id + "\"");
    if (begin == std::string::npos) return "";
    const size_t end = html.find("</svg>", begin);
    return end == std::string::npos ? "" : html.substr(begin, end - begin);
}

// What the run left: the values the page must show.
struct Expected {
    int log_intervals = 0, validations = 0, world_size = 0;
    std::map<std::pair<int, int>, int64_t> bytes;  // (src, dst) -> bytes over all groups
};

Expected expected_from(const std::string& dir) {
    Expected e;
    std::ifstream f(dir + "/metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
        const json j = json::parse(line);
        e.log_intervals += j.contains("lm loss") ? 1 : 0;
        e.validations += j.contains("validation lm loss") ? 1 : 0;
    }
    const json m = test::read_json(dir + "/comm_matrix.json");
    e.world_size = m.value("world_size", 0);
    for (const json& p : m.value("pairs", json::array())) {
        e.bytes[{p["src"].get<int>(), p["dst"].get<int>()}] += p["bytes"].get<int64_t>();
    }
    return e;
}

// The page's structure, on the HTML a file holds or on the DOM Chromium dumps (which keeps the attributes).
void expect_page_structure(const std::string& html, const Expected& e) {
    for (const auto& [id, labels] : kLineCharts) {
        const std::string svg = svg_element(html, id);
        ASSERT_FALSE(svg.empty()) << "no <svg id=\"" << id << "\">";
        for (const std::string& label : labels) {
            EXPECT_EQ(count(svg, ">" + label + "</text>"), 1u) << id << ": no axis label '" << label << "'";
        }
        EXPECT_NE(svg.find("class=\"axis-label\""), std::string::npos) << id;
        EXPECT_GE(count(svg, "class=\"tick\""), 4u) << id << ": axes without tick labels";
    }
    const std::string loss = svg_element(html, "chart-loss");
    EXPECT_NE(loss.find("data-series=\"training\" data-points=\"" + std::to_string(e.log_intervals) + "\""),
              std::string::npos)
        << "the training loss should have one point per log interval (" << e.log_intervals << ")";
    EXPECT_NE(loss.find("data-series=\"validation\" data-points=\"" + std::to_string(e.validations) + "\""),
              std::string::npos)
        << "the validation loss should have one point per validation (" << e.validations << ")";
    EXPECT_FALSE(svg_element(html, "chart-memory").empty());
    EXPECT_EQ(count(svg_element(html, "chart-memory"), "class=\"bar\""), 2u) << "planned and peak";

    const std::string heatmap = svg_element(html, "comm-heatmap");
    ASSERT_FALSE(heatmap.empty()) << "no <svg id=\"comm-heatmap\">";
    EXPECT_EQ(count(heatmap, "class=\"cell\""), static_cast<size_t>(e.world_size * e.world_size));
    EXPECT_EQ(count(heatmap, ">source rank</text>") + count(heatmap, ">destination rank</text>"), 2u);
    for (int src = 0; src < e.world_size; ++src) {
        for (int dst = 0; dst < e.world_size; ++dst) {
            const auto it = e.bytes.find({src, dst});
            const std::string cell = "data-row=\"" + std::to_string(src) + "\" data-col=\"" + std::to_string(dst) +
                                     "\" data-value=\"" + std::to_string(it == e.bytes.end() ? 0 : it->second) + "\"";
            EXPECT_EQ(count(heatmap, cell), 1u) << "cell " << src << " -> " << dst << " should hold comm_matrix.json's "
                                                << "bytes: " << cell;
        }
    }
    EXPECT_EQ(count(html, "class=\"missing\""), 0u) << "a run with validation and 2 ranks lacks nothing";
}

class ReportE2E : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = std::make_unique<test::TempDir>("ms_report_e2e");
        const std::string cmd =
            "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive timeout 120 mpiexec -n 2 --oversubscribe --allow-run-as-root '" +
            std::string(MS_BINARY_PATH) +
            "' train --config " MS_SOURCE_DIR "/tests/parallel/tiny.yaml --set run.output_dir=" + dir_->path() +
            " --set parallel.pipeline_model_parallel_size=2 --set training.train_iters=6"
            " --set eval.eval_interval=3 --set eval.eval_iters=1 2>&1";
        train_ = test::run_command(cmd, dir_->path());
        report_ = test::run_cli("report " + dir_->path());
    }
    static void TearDownTestSuite() { dir_.reset(); }

    static std::unique_ptr<test::TempDir> dir_;
    static test::JobRun train_;
    static test::CliResult report_;
};
std::unique_ptr<test::TempDir> ReportE2E::dir_;
test::JobRun ReportE2E::train_;
test::CliResult ReportE2E::report_;

TEST_F(ReportE2E, PageHasEveryChart) {
    ASSERT_EQ(train_.code, 0) << train_.output;
    ASSERT_EQ(report_.exit_code, 0) << report_.output;
    EXPECT_EQ(report_.output, *dir_ / "report.html" + "\n") << "stdout is the page's path";
    const Expected e = expected_from(dir_->path());
    ASSERT_EQ(e.world_size, 2);
    ASSERT_EQ(e.log_intervals, 6);
    ASSERT_EQ(e.validations, 2);
    expect_page_structure(test::read_file(*dir_ / "report.html"), e);
}

// Nothing outside the file: no script, no link, no fetched style, font or image (the SVG namespace is a name, not a
// fetch).
TEST_F(ReportE2E, PageIsSelfContained) {
    ASSERT_EQ(report_.exit_code, 0) << report_.output;
    const std::string html = test::read_file(*dir_ / "report.html");
    for (const char* needle :
         {"<script", "<link", "<img", "<iframe", "src=", "href=", "url(", "@import", "@font-face"}) {
        EXPECT_EQ(count(html, needle), 0u) << needle;
    }
    EXPECT_EQ(count(html, "http"), count(html, "xmlns=\"http://www.w3.org/2000/svg\"")) << "only the SVG namespace";
}

TEST_F(ReportE2E, OutputOption) {
    ASSERT_EQ(train_.code, 0) << train_.output;
    const test::TempDir out("ms_report_out");
    const test::CliResult r = test::run_cli("report " + dir_->path() + " -o " + (out / "page.html"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output, out / "page.html" + "\n");
    EXPECT_EQ(test::read_file(out / "page.html"), test::read_file(*dir_ / "report.html")) << "the same page";
}

// Headless Chromium parses the page and lays it out: the charts are SVG elements of the SVG namespace with a size,
// their axis labels are rendered text with a width (a font was found), the loss polyline has one point per log
// interval and the heatmap world_size^2 cells. The page has no script; the test's copy appends one that measures
// the laid-out DOM into a <pre id="measured">, and --dump-dom returns it with the DOM.
TEST_F(ReportE2E, RendersInHeadlessChromium) {
    if (std::system("command -v chromium > /dev/null 2>&1") != 0) {
        GTEST_SKIP() << "chromium is not installed (Debian: apt-get install --no-install-recommends chromium); the "
                        "page's structure is still checked in its HTML text (PageHasEveryChart)";
    }
    ASSERT_EQ(report_.exit_code, 0) << report_.output;
    std::string page = test::read_file(*dir_ / "report.html");
    const std::string measure = R"(<script>
const out = {};
for (const svg of document.querySelectorAll('svg.chart')) {
  const box = svg.getBoundingClientRect();
  const line = svg.querySelector('polyline[data-series="training"]');
  out[svg.id] = {ns: svg.namespaceURI, width: box.width, height: box.height,
                 labels: [...svg.querySelectorAll('text.axis-label')].map(t => [t.textContent, t.getComputedTextLength()]),
                 cells: svg.querySelectorAll('rect.cell').length,
                 training_points: line ? line.points.numberOfItems : 0};
}
const pre = document.createElement('pre');
pre.id = 'measured';
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>
)";
    page.insert(page.rfind("</body>"), measure);
    const test::TempDir tmp("ms_report_chromium");
    std::ofstream(tmp / "page.html") << page;
    const test::JobRun dom =
        test::run_command("timeout 90 chromium --headless --disable-gpu --no-sandbox --dump-dom 'file://" +
                              (tmp / "page.html") + "' 2>/dev/null",
                          tmp.path());
    ASSERT_EQ(dom.code, 0) << dom.output;
    const Expected e = expected_from(dir_->path());
    expect_page_structure(dom.output, e);

    const size_t begin = dom.output.find("<pre id=\"measured\">"), end = dom.output.find("</pre>", begin);
    ASSERT_NE(begin, std::string::npos) << "the measuring script did not run:\n" << dom.output.substr(0, 2000);
    std::string text = dom.output.substr(begin + 19, end - begin - 19);
    for (const auto& [entity, c] : std::vector<std::pair<std::string, std::string>>{
             {"&lt;", "<"}, {"&gt;", ">"}, {"&amp;", "&"}}) {  // & last: the serialiser escapes these in text
        for (size_t at = text.find(entity); at != std::string::npos; at = text.find(entity, at + 1)) {
            text.replace(at, entity.size(), c);
        }
    }
    const json measured = json::parse(text);
    for (const char* id :
         {"chart-loss", "chart-lr", "chart-throughput", "chart-mfu", "chart-comm", "chart-memory", "comm-heatmap"}) {
        ASSERT_TRUE(measured.contains(id)) << id << " is not an svg.chart in Chromium's DOM";
        const json& m = measured[id];
        EXPECT_EQ(m["ns"], "http://www.w3.org/2000/svg") << id;
        EXPECT_GT(m["width"].get<double>(), 100) << id;
        EXPECT_GT(m["height"].get<double>(), 100) << id;
        ASSERT_FALSE(m["labels"].empty()) << id << " has no axis labels";
        for (const json& label : m["labels"]) EXPECT_GT(label[1].get<double>(), 0) << id << ": " << label[0];
    }
    EXPECT_EQ(measured["chart-loss"]["training_points"], e.log_intervals);
    EXPECT_EQ(measured["comm-heatmap"]["cells"], e.world_size * e.world_size);
}

// A run directory with only metrics.jsonl's training lines: the charts it can draw, and a sentence for each input
// it lacks (validation, the matrix); a matrix of one rank is said to be one.
TEST_F(ReportE2E, MissingInputsAreSaidOnThePage) {
    ASSERT_EQ(train_.code, 0) << train_.output;
    const test::TempDir dir("ms_report_missing");
    {
        std::ifstream in(*dir_ / "metrics.jsonl");
        std::ofstream out(dir / "metrics.jsonl");
        for (std::string line; std::getline(in, line);) {
            if (line.find("validation lm loss") == std::string::npos) out << line << '\n';
        }
    }
    test::CliResult r = test::run_cli("report " + dir.path());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::string html = test::read_file(dir / "report.html");
    EXPECT_NE(html.find("id=\"missing-validation\""), std::string::npos);
    EXPECT_NE(html.find("id=\"missing-comm-matrix\">No comm_matrix.json"), std::string::npos);
    EXPECT_FALSE(svg_element(html, "chart-loss").empty());
    EXPECT_TRUE(svg_element(html, "comm-heatmap").empty());
    EXPECT_NE(svg_element(html, "chart-loss").find("data-series=\"training\" data-points=\"6\""), std::string::npos);
    EXPECT_EQ(svg_element(html, "chart-loss").find("data-series=\"validation\""), std::string::npos);

    std::ofstream(dir / "comm_matrix.json") << R"({"world_size": 1, "pairs": [], "by_group": {}})";
    r = test::run_cli("report " + dir.path());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    html = test::read_file(dir / "report.html");
    EXPECT_NE(html.find("id=\"missing-comm-matrix\">One rank"), std::string::npos);
}

TEST(Report, DirectoryWithoutMetricsIsAnErrorSentence) {
    const test::TempDir dir("ms_report_empty");
    const test::CliResult r = test::run_cli("report " + dir.path());
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(dir / "metrics.jsonl does not exist"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("mindspeed-train train --config"), std::string::npos) << "how to make one:\n" << r.output;
    EXPECT_FALSE(std::filesystem::exists(dir / "report.html"));

    const test::CliResult none = test::run_cli("report " + dir / "no-such-run");
    EXPECT_EQ(none.exit_code, 2) << none.output;
    EXPECT_NE(none.output.find("run directory '" + dir / "no-such-run" + "' does not exist"), std::string::npos)
        << none.output;
}

// Axis ticks are round numbers (1, 2 or 5 times a power of ten) that cover the data; byte values print in binary
// units.
TEST(Report, NiceTicks) {
    EXPECT_EQ(report::nice_ticks(0.3, 4.2), (std::vector<double>{0, 1, 2, 3, 4, 5}));
    EXPECT_EQ(report::nice_ticks(1, 300), (std::vector<double>{0, 100, 200, 300}));
    EXPECT_EQ(report::nice_ticks(-12, 7), (std::vector<double>{-15, -10, -5, 0, 5, 10}));
    const std::vector<double> lr = report::nice_ticks(0, 0.003);
    ASSERT_EQ(lr.size(), 4u);
    EXPECT_DOUBLE_EQ(lr[1], 0.001);
    EXPECT_DOUBLE_EQ(lr.back(), 0.003);
    EXPECT_EQ(report::format_value(1536, report::ValueFormat::kBytes), "1.50 KiB");
    EXPECT_EQ(report::format_value(12345, report::ValueFormat::kSi), "12.3k");
    EXPECT_EQ(report::escape("a<b & \"c\">"), "a&lt;b &amp; &quot;c&quot;&gt;");
}

// A long run's series is drawn thinned, keeping each bucket's extremes: a spike among 100000 points stays at the top
// of the plot, a missing value still breaks the line, and the page stays small.
TEST(Report, LongSeriesKeepsSpikesAndGaps) {
    report::Series s{"loss", {}, {}, "#000"};
    for (int i = 0; i < 100000; ++i) {
        s.x.push_back(i + 1);
        s.y.push_back(i == 54321 ? 100.0 : i == 70000 ? std::nan("") : 1.0);
    }
    const std::string svg = report::render_line_chart({"chart-long", "Long", "iteration", "loss", {s}});
    EXPECT_EQ(count(svg, "<polyline"), 2u) << "one break, at the missing value";
    EXPECT_EQ(count(svg, "data-points=\"99999\""), 2u) << "data-points counts the data, not what is drawn";
    size_t drawn = 0;
    for (size_t at = svg.find("points=\""); at != std::string::npos; at = svg.find("points=\"", at + 1)) {
        if (svg.compare(at - 5, 5, "data-") == 0) continue;
        drawn += count(svg.substr(at, svg.find('"', at + 8) - at), ",");
    }
    EXPECT_LE(drawn, 2000u);
    EXPECT_GE(drawn, 1000u);
    EXPECT_NE(svg.find(",34.0"), std::string::npos) << "the spike (100, the top tick) is drawn at the plot's top";
    EXPECT_EQ(count(svg, "<circle"), 0u) << "no markers on a long series";
}

}  // namespace
}  // namespace ms
