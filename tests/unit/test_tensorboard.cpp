// test_tensorboard.cpp: TensorBoard event files (engine/train/tensorboard.h): CRC-32C against published vectors, the
// bytes of one scalar event and its TFRecord worked out by hand, a metrics record's scalars, and a writer that never
// reuses an existing file. TensorBoard's own reader reads a trained run's file in tests/e2e/test_tensorboard.cpp.
#include "engine/train/tensorboard.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "tests/common/temp_dir.h"

namespace ms {
namespace {

std::string bytes(std::initializer_list<int> b) {
    std::string s;
    for (int x : b) s += static_cast<char>(x);
    return s;
}

std::string le32(uint32_t v) {
    return bytes({int(v & 0xff), int((v >> 8) & 0xff), int((v >> 16) & 0xff), int(v >> 24)});
}

TEST(TensorBoard, Crc32cMatchesPublishedVectors) {
    // The check value of the CRC-32C catalogue, and RFC 3720's (iSCSI) B.4 vectors.
    EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
    EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
    EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
    std::string ascending;
    for (int i = 0; i < 32; ++i) ascending += static_cast<char>(i);
    EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
    EXPECT_EQ(crc32c(""), 0u);
    // TFRecord's mask: rotate right by 15, add 0xa282ead8.
    EXPECT_EQ(masked_crc32c("123456789"), ((0xE3069283u >> 15) | (0xE3069283u << 17)) + 0xa282ead8u);
}

TEST(TensorBoard, ScalarEventBytesAreTheProtobufEncoding) {
    // Event{wall_time: 1.5, step: 300, summary{value{tag: "a", simple_value: 2.0}}}, field by field:
    const std::string value = bytes({0x0a, 0x01, 'a',                     // Value.tag (1, length-delimited): "a"
                                     0x15, 0x00, 0x00, 0x00, 0x40});      // Value.simple_value (2, fixed32): 2.0f
    const std::string summary = bytes({0x0a, 0x08}) + value;              // Summary.value (1): 8 bytes
    const std::string event = bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f,  // Event.wall_time (1, fixed64): 1.5
                                     0x10, 0xac, 0x02,                    // Event.step (2, varint): 300
                                     0x2a, 0x0a}) +                       // Event.summary (5): 10 bytes
                              summary;
    EXPECT_EQ(scalar_event(1.5, 300, "a", 2.0f), event);

    // file_version (3): "brain.Event:2", no step field at step 0; SessionLog (7) {status (1): START = 1}.
    EXPECT_EQ(file_version_event(1.5), bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x1a, 13}) + "brain.Event:2");
    EXPECT_EQ(session_start_event(1.5, 7), bytes({0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x10, 7, 0x3a, 2, 0x08, 1}));

    // The TFRecord: uint64 length, masked CRC of those 8 bytes, the data, masked CRC of the data.
    const std::string length = bytes({int(event.size()), 0, 0, 0, 0, 0, 0, 0});
    EXPECT_EQ(tfrecord(event), length + le32(masked_crc32c(length)) + event + le32(masked_crc32c(event)));
    EXPECT_EQ(tfrecord(event).size(), 8 + 4 + event.size() + 4);
}

TEST(TensorBoard, ScalarsOfAMetricsRecordUseMegatronsNames) {
    const nlohmann::json record = {{"iteration", 20},      {"consumed_samples", 320},
                                   {"time", 1.7e9},        {"learning-rate", 0.003},
                                   {"grad-norm", nullptr}, {"bytes_per_step", {{"tp", 0}, {"dp", 4096}}},
                                   {"lm loss", 2.5}};
    std::map<std::string, double> got;
    for (const TensorBoardScalar& s : tensorboard_scalars(record)) {
        EXPECT_EQ(s.step, 20) << s.tag;
        got[s.tag] = s.value;
    }
    const std::map<std::string, double> want = {{"consumed_samples", 320},
                                                {"learning-rate", 0.003},
                                                {"bytes_per_step/tp", 0},
                                                {"bytes_per_step/dp", 4096},
                                                {"lm loss", 2.5}};
    EXPECT_EQ(got, want);

    const nlohmann::json validation = {{"iteration", 40}, {"consumed_samples", 640}, {"validation lm loss", 2.0}};
    got.clear();
    for (const TensorBoardScalar& s : tensorboard_scalars(validation)) got[s.tag] = s.value;
    EXPECT_EQ(got.at("lm loss validation"), 2.0);
    EXPECT_DOUBLE_EQ(got.at("lm loss validation ppl"), std::exp(2.0));
    EXPECT_EQ(got.count("validation lm loss"), 0u);

    EXPECT_TRUE(tensorboard_scalars(nlohmann::json{{"lm loss", 1.0}}).empty());  // no iteration, no step
}

TEST(TensorBoard, EveryWriterGetsANewFileAndLeavesOthersAlone) {
    const test::TempDir dir("ms_tb");
    const std::string sub = dir / "tb";  // created by the writer
    std::string first;
    {
        TensorBoardWriter w(sub, 1);
        first = w.path();
        w.add_record({{"iteration", 1}, {"time", 1.5}, {"lm loss", 3.0}});
    }
    const auto size_before = std::filesystem::file_size(first);
    TensorBoardWriter w(sub, 2);  // within the same second, usually: the name takes a suffix
    EXPECT_NE(w.path(), first);
    EXPECT_NE(std::filesystem::path(w.path()).filename().string().find("events.out.tfevents."), std::string::npos);
    EXPECT_EQ(std::filesystem::file_size(first), size_before);

    // The first file: the file version, the START at step 1, then the one scalar, exactly.
    std::ifstream in(first, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string body = ss.str();
    EXPECT_EQ(body.substr(0, 12), tfrecord(file_version_event(0)).substr(0, 12));  // the same length and its CRC
    EXPECT_EQ(body.substr(body.size() - tfrecord(scalar_event(1.5, 1, "lm loss", 3.0f)).size()),
              tfrecord(scalar_event(1.5, 1, "lm loss", 3.0f)));
}

TEST(TensorBoard, AnUnwritableDirectoryIsASentence) {
    const test::TempDir dir("ms_tb");
    std::ofstream(dir / "file") << "x";
    try {
        TensorBoardWriter w(dir / "file", 1);
        FAIL() << "a file as the directory was accepted";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("logging.tensorboard_dir"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace ms
