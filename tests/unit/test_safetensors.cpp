// test_safetensors.cpp: engine/ckpt/safetensors -- round trips of every engine dtype (with an empty and a 0-rank
// tensor and metadata), one tiny file checked byte by byte against the format in
// docs/formats.md, the Python `safetensors` package when the machine has it, and one
// crafted corrupt input per validation rule, each of which must be a UserError naming the file, the tensor and
// the problem.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "engine/ckpt/safetensors.h"
#include "engine/core/check.h"
#include "tests/common/temp_dir.h"

namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed at the end.
class TempDir : public ms::test::TempDir {
  public:
    TempDir() : ms::test::TempDir("ms_safetensors_test") {}
};

std::string read_all(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string u64le(uint64_t v) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
    return s;
}

// A safetensors image from a header given verbatim (no padding added) and a byte buffer.
std::string image(const std::string& header, const std::string& buffer) {
    return u64le(header.size()) + header + buffer;
}

// Expects open_from_memory(bytes) to throw a UserError whose message holds every fragment.
void expect_rejected(const std::string& bytes, std::initializer_list<std::string> fragments) {
    try {
        ms::SafetensorsFile::open_from_memory(bytes, "crafted.safetensors");
        ADD_FAILURE() << "accepted; expected an error mentioning '" << *fragments.begin() << "'";
    } catch (const ms::UserError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("crafted.safetensors"), std::string::npos) << msg;
        for (const std::string& f : fragments)
            EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
        EXPECT_EQ(e.exit_code(), ms::kExitCheckpoint);
    }
}

TEST(SafetensorsTest, RoundTripsEveryEngineDtypeWithEmptyScalarAndMetadata) {
    TempDir dir;
    const std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f};
    const std::vector<uint16_t> bf16 = {0x3F80, 0xC000, 0x7F80, 0x0001, 0xFFFF};  // 1, -2, inf, denormal, NaN
    const std::vector<uint16_t> f16 = {0x3C00, 0xBC00, 0x7BFF};
    const std::vector<int32_t> i32 = {-7};
    const std::vector<uint16_t> u16 = {0, 1, 50256, 65535};
    const std::vector<ms::TensorEntry> tensors = {
        {"h.0.attn.c_attn.weight", ms::DType::kF32, {2, 3}, f32.data()},
        {"bf16.odd", ms::DType::kBF16, {5}, bf16.data()},  // odd count: the next tensor would be misaligned
        {"f16", ms::DType::kF16, {1, 1, 3}, f16.data()},
        {"step", ms::DType::kI32, {}, i32.data()},  // 0-rank
        {"tokens", ms::DType::kU16, {4}, u16.data()},
        {"empty", ms::DType::kF32, {0, 4}, nullptr},
        {"z.last", ms::DType::kF32, {2}, f32.data()},
    };
    const std::map<std::string, std::string> meta = {{"format", "pt"}, {"mst", R"({"global_shape": [2, 3]})"}};
    const std::string path = dir / "model.safetensors";
    ms::write_safetensors(path, tensors, meta);
    EXPECT_FALSE(fs::exists(path + ".tmp"));

    const ms::SafetensorsFile f = ms::SafetensorsFile::open(path);
    EXPECT_EQ(f.metadata(), meta);
    EXPECT_EQ(f.names(), (std::vector<std::string>{"bf16.odd", "empty", "f16", "h.0.attn.c_attn.weight", "step",
                                                   "tokens", "z.last"}));
    for (const ms::TensorEntry& t : tensors) {
        SCOPED_TRACE(t.name);
        const ms::TensorInfo& info = f.info(t.name);
        EXPECT_EQ(info.dtype, t.dtype);
        EXPECT_EQ(info.dtype_name, ms::safetensors_dtype(t.dtype));
        EXPECT_EQ(info.shape, t.shape);
        const size_t nbytes = static_cast<size_t>(info.numel()) * ms::dtype_size(t.dtype);
        ASSERT_EQ(info.nbytes(), nbytes);
        if (nbytes) {
            EXPECT_EQ(std::memcmp(f.data(t.name), t.data, nbytes), 0);
        }
        // Larger elements first + 8-byte header padding: every tensor is aligned to its element size.
        EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data(t.name)) % ms::dtype_size(t.dtype), 0u);
    }
    EXPECT_EQ(f.info("step").numel(), 1);
    EXPECT_EQ(f.info("empty").numel(), 0);
    EXPECT_TRUE(f.contains("tokens"));
    EXPECT_FALSE(f.contains("wte.weight"));
    EXPECT_THROW(f.info("wte.weight"), ms::UserError);

    // Writing again over the same path (mmapped above) replaces it by rename: the open mapping still reads the
    // old bytes, a fresh open reads the new ones (safetensors #762: O_TRUNC on a mapped file zero-filled it).
    const std::vector<float> other = {9.0f, 8.0f};
    ms::write_safetensors(path, {{"z.last", ms::DType::kF32, {2}, other.data()}}, {});
    EXPECT_EQ(std::memcmp(f.data("z.last"), f32.data(), 8), 0);
    const ms::SafetensorsFile g = ms::SafetensorsFile::open(path);
    EXPECT_EQ(g.names(), std::vector<std::string>{"z.last"});
    EXPECT_TRUE(g.metadata().empty());
    EXPECT_EQ(std::memcmp(g.data("z.last"), other.data(), 8), 0);
}

TEST(SafetensorsTest, NoTensorsIsAValidFile) {
    TempDir dir;
    ms::write_safetensors(dir / "e.safetensors", {}, {});
    EXPECT_EQ(read_all(dir / "e.safetensors"), u64le(8) + "{}      ");
    EXPECT_TRUE(ms::SafetensorsFile::open(dir / "e.safetensors").names().empty());
}

// The whole file of two tiny tensors, written out by hand from the format description.
TEST(SafetensorsTest, ExactByteLayoutOfATinyFile) {
    TempDir dir;
    const std::vector<float> b = {1.0f, -2.0f};                // 00 00 80 3f | 00 00 00 c0
    const std::vector<uint16_t> a = {0x3F80, 0x4000, 0xC040};  // bf16 1, 2, -3
    ms::write_safetensors(dir / "t.safetensors",
                          {{"a", ms::DType::kBF16, {3}, a.data()}, {"b", ms::DType::kF32, {2}, b.data()}},
                          {{"k", "v"}});
    // The F32 tensor comes first although "a" < "b": descending element size, then name (tensor.rs:227-232).
    const std::string json = R"({"__metadata__":{"k":"v"},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("a":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]}})";
    ASSERT_EQ(json.size(), 134u);  // 134 = 16*8 + 6: two spaces pad the header to 136
    const std::string expected = std::string("\x88\0\0\0\0\0\0\0", 8) + json + "  " +
                                 std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8) +
                                 std::string("\x80\x3f\x00\x40\x40\xc0", 6);
    const std::string got = read_all(dir / "t.safetensors");
    ASSERT_EQ(got.size(), 8u + 136u + 14u);
    EXPECT_EQ(got, expected);
}

// Debian ships python3-torch (1.13, no safetensors support) but not the `safetensors` package; when a machine has
// it, the files must cross both ways.
TEST(SafetensorsTest, PythonSafetensorsPackageReadsAndWritesTheSameFormat) {
    const std::string python = MS_SYSTEM_PYTHON;
    if (python.empty() || std::system((python + " -c 'import safetensors.numpy, numpy' 2>/dev/null").c_str()) != 0)
        GTEST_SKIP() << "the Python package `safetensors` is not installed for " << python
                     << " (Debian's python3-torch does not provide it): cross-check skipped";
    TempDir dir;
    const std::vector<float> w = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
    const std::vector<int32_t> s = {42};
    ms::write_safetensors(dir / "ours.safetensors",
                          {{"w", ms::DType::kF32, {2, 3}, w.data()}, {"s", ms::DType::kI32, {}, s.data()}},
                          {{"format", "pt"}});
    const std::string script = dir / "check.py";
    std::ofstream(script) << "import sys, numpy as np\n"
                             "from safetensors.numpy import load_file, save_file\n"
                             "from safetensors import safe_open\n"
                             "t = load_file(sys.argv[1])\n"
                             "assert t['w'].dtype == np.float32 and t['w'].shape == (2, 3), t['w']\n"
                             "assert (t['w'] == np.arange(1, 7, dtype=np.float32).reshape(2, 3)).all()\n"
                             "assert t['s'].dtype == np.int32 and t['s'].shape == () and int(t['s']) == 42\n"
                             "with safe_open(sys.argv[1], 'np') as f: assert f.metadata() == {'format': 'pt'}\n"
                             "save_file({'x': np.array([[1, 2], [3, 4]], dtype=np.uint16),\n"
                             "           'y': np.array([0.5], dtype=np.float32)}, sys.argv[2], metadata={'m': 'n'})\n";
    ASSERT_EQ(
        std::system(
            (python + " " + script + " " + (dir / "ours.safetensors") + " " + (dir / "theirs.safetensors")).c_str()),
        0);
    const ms::SafetensorsFile f = ms::SafetensorsFile::open(dir / "theirs.safetensors");
    EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"m", "n"}}));
    EXPECT_EQ(f.info("x").dtype, ms::DType::kU16);
    EXPECT_EQ(f.info("x").shape, (std::vector<int64_t>{2, 2}));
    const uint16_t x[4] = {1, 2, 3, 4};
    EXPECT_EQ(std::memcmp(f.data("x"), x, 8), 0);
    float y;
    std::memcpy(&y, f.data("y"), 4);
    EXPECT_EQ(y, 0.5f);
}

TEST(SafetensorsTest, ForeignDtypesAreReadWithoutAnEngineType) {
    // U8 and I64 (causal-mask buffers, position ids in some HF files) and sub-byte F4 validate by their bit width.
    const std::string f = image(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[8,11]},)"
                                R"("p":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
                                R"("q":{"dtype":"F4","shape":[2],"data_offsets":[11,12]}})",
                                std::string(12, '\1'));
    const ms::SafetensorsFile s = ms::SafetensorsFile::open_from_memory(f);
    EXPECT_EQ(s.info("m").dtype_name, "BOOL");
    EXPECT_FALSE(s.info("p").dtype.has_value());
    EXPECT_EQ(s.info("q").nbytes(), 1u);
    expect_rejected(image(R"({"q":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", "\0\0"),
                    {"tensor 'q'", "not a whole number of bytes"});
}

TEST(SafetensorsTest, TruncatedFile) {
    TempDir dir;
    const std::vector<float> w(16, 1.0f);
    const std::string path = dir / "w.safetensors";
    ms::write_safetensors(path, {{"w", ms::DType::kF32, {16}, w.data()}}, {});
    fs::resize_file(path, fs::file_size(path) - 1);
    try {
        ms::SafetensorsFile::open(path);
        ADD_FAILURE() << "a truncated file was accepted";
    } catch (const ms::UserError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(path), std::string::npos) << msg;
        EXPECT_NE(msg.find("tensor 'w'"), std::string::npos) << msg;
        EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
    }
    expect_rejected(std::string("\x10\0\0", 3), {"too short"});
    expect_rejected("", {"too short"});
    EXPECT_THROW(ms::SafetensorsFile::open(dir / "missing.safetensors"), ms::UserError);
    EXPECT_THROW(ms::SafetensorsFile::open(dir / ""), ms::UserError);  // a directory
}

TEST(SafetensorsTest, HeaderLengthLargerThanTheFileOrTheLimit) {
    expect_rejected(u64le(1000) + "{}", {"header length 1000", "runs past the end of the 10-byte file"});
    expect_rejected(u64le(100'000'001) + "{}", {"MAX_HEADER_SIZE"});
    expect_rejected(u64le(~uint64_t{0}) + "{}", {"MAX_HEADER_SIZE"});
    expect_rejected(u64le(0), {"does not start with '{'"});
    expect_rejected(image(R"( {})", ""), {"does not start with '{'"});
}

TEST(SafetensorsTest, BadJson) {
    expect_rejected(image(R"({"a": {)", ""), {"not valid JSON"});
    expect_rejected(image(R"({} trailing)", ""), {"not valid JSON"});
    expect_rejected(image("{\"\xff\":1}", ""), {"not valid JSON"});  // not UTF-8
    expect_rejected(image(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                          R"("a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})",
                          ""),
                    {"key 'a' twice"});
    expect_rejected(image(R"({"a":[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]})", ""), {"nests deeper"});
    expect_rejected(image(R"({"__metadata__":{"n":1}})", ""), {"strings only"});
    expect_rejected(image(R"({"a":3})", ""), {"tensor 'a'", "not an object"});
    expect_rejected(image(R"({"a":{"shape":[],"data_offsets":[0,4]}})", "1234"), {"tensor 'a'", "dtype"});
    expect_rejected(image(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", "1234"), {"tensor 'a'", "shape"});
    expect_rejected(image(R"({"a":{"dtype":"F32","shape":[]}})", "1234"), {"tensor 'a'", "data_offsets"});
    expect_rejected(image(R"({"a":{"dtype":"F32","shape":[],"data_offsets":[0,4,8]}})", "1234"),
                    {"tensor 'a'", "data_offsets"});
    // Padding with spaces is allowed at any length, not only to a multiple of 8.
    EXPECT_NO_THROW(ms::SafetensorsFile::open_from_memory(image(R"({}   )", "")));
}

TEST(SafetensorsTest, UnknownDtype) {
    expect_rejected(image(R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", std::string(16, '\0')),
                    {"tensor 'w'", "unknown dtype \"F128\""});
    expect_rejected(image(R"({"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0')),
                    {"tensor 'w'", "unknown dtype"});
}

TEST(SafetensorsTest, NegativeOrNonIntegerShape) {
    expect_rejected(image(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", ""),
                    {"tensor 'w'", "not a non-negative integer"});
    expect_rejected(image(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "1234"),
                    {"tensor 'w'", "not a non-negative integer"});
    expect_rejected(image(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""),
                    {"tensor 'w'", "overflows"});
}

TEST(SafetensorsTest, OffsetsOverlapLeaveAHoleOrDoNotCover) {
    const std::string buf12(12, '\0'), buf20(20, '\0');
    expect_rejected(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                          buf12),
                    {"tensor 'b'", "overlap tensor 'a'"});
    expect_rejected(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                          buf20),
                    {"tensor 'b'", "hole of 4 bytes"});
    expect_rejected(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", buf12),
                    {"tensor 'a'", "hole of 4 bytes"});
    expect_rejected(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", buf12),
                    {"4 trailing bytes belong to no tensor"});
    expect_rejected(image(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", buf12),
                    {"tensor 'a'", "ends at byte 16", "truncated"});
    expect_rejected(image(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", buf12),
                    {"tensor 'a'", "end before they begin"});
    // Two tensors sharing bytes (a tied weight stored once, referenced twice) is an overlap too.
    expect_rejected(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                          std::string(8, '\0')),
                    {"overlap"});
    // Empty tensors may sit anywhere inside the buffer, at an offset another tensor starts at.
    EXPECT_NO_THROW(
        ms::SafetensorsFile::open_from_memory(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                                    R"("e":{"dtype":"F32","shape":[0,3],"data_offsets":[8,8]},)"
                                                    R"("f":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})",
                                                    std::string(8, '\0'))));
}

TEST(SafetensorsTest, SizeMismatchWithShape) {
    expect_rejected(image(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')),
                    {"tensor 'w'", "hold 8 bytes", "needs 12 bytes"});
    expect_rejected(image(R"({"w":{"dtype":"BF16","shape":[],"data_offsets":[0,4]}})", std::string(4, '\0')),
                    {"tensor 'w'", "needs 2 bytes"});
}

}  // namespace
