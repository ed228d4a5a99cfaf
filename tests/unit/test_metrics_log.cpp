// test_metrics_log.cpp: engine/train/metrics_log -- a resume keeps the lines up to the checkpoint's iteration, drops
// the later ones and a torn last line, and leaves an already clean file untouched.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/train/metrics_log.h"
#include "tests/common/temp_dir.h"

namespace {

std::string read(const std::string& path) {
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(MetricsLog, DropsTheLinesPastTheCheckpointAndATornLine) {
    ms::test::TempDir dir("ms_metrics_log");
    const std::string path = dir.path() + "/metrics.jsonl";
    write(path,
          "{\"iteration\":1,\"lm loss\":3.5}\n"
          "{\"iteration\":2,\"lm loss\":3.25}\n"
          "{\"iteration\":2,\"validation lm loss\":3.3}\n"
          "{\"iteration\":3,\"lm loss\":3.0}\n"
          "{\"iteration\":4,\"lm loss\":2.75}\n"
          "{\"iteration\":5,\"lm lo");  // the crash tore this one
    const ms::MetricsTrim trim = ms::trim_metrics_log(path, 2);
    EXPECT_EQ(trim.kept, 3);
    EXPECT_EQ(trim.dropped, 3);
    EXPECT_EQ(read(path),
              "{\"iteration\":1,\"lm loss\":3.5}\n"
              "{\"iteration\":2,\"lm loss\":3.25}\n"
              "{\"iteration\":2,\"validation lm loss\":3.3}\n");
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(MetricsLog, LeavesACleanFileAndAMissingFileAlone) {
    ms::test::TempDir dir("ms_metrics_log");
    const std::string path = dir.path() + "/metrics.jsonl";
    const ms::MetricsTrim none = ms::trim_metrics_log(path, 4);
    EXPECT_EQ(none.kept + none.dropped, 0);
    EXPECT_FALSE(std::filesystem::exists(path));  // nothing created

    const std::string clean = "{\"iteration\":1,\"lm loss\":3.5}\n{\"iteration\":2,\"lm loss\":3.25}\n";
    write(path, clean);
    const auto before = std::filesystem::last_write_time(path);
    const ms::MetricsTrim trim = ms::trim_metrics_log(path, 2);
    EXPECT_EQ(trim.kept, 2);
    EXPECT_EQ(trim.dropped, 0);
    EXPECT_EQ(read(path), clean);
    EXPECT_EQ(std::filesystem::last_write_time(path), before);  // not rewritten
}

}  // namespace
