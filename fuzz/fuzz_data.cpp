// fuzz_data.cpp: libFuzzer target for the token file readers in engine/data (Megatron .bin/.idx, llm.c shards,
// nanoGPT .bin), opened through the public API -- open_token_source() on files written per input -- and read
// through a Sampler. Any input must either open or be rejected with ms::UserError: no crash, no sanitizer report,
// no SIGBUS, no other exception, no MS_CHECK abort.
//
// Input layout:
//   byte 0        format = (b & 3) % 3 (0 megatron, 1 llmc, 2 nanogpt); bit 2: llmc/nanogpt get two files, not one;
//                 bits 3-4: vocab_limit = {0, 257, 50257, 65536}[(b >> 3) % 4]
//   byte 1        seq_length T = 1 + b % 64
//   byte 2        data.split = kSplits[b % 6]
//   bytes 3-4     u16le: the length of the first file (clamped to what is left)
//   rest          the first file, then the second: megatron <prefix>.idx then <prefix>.bin; llmc/nanogpt
//                 shard_0.bin then (two files) shard_1.bin, found through the glob shard_*.bin
// Seeds: fuzz/make_seeds.py writes valid files of each format in this layout.
//
// When a source opens, its promises are checked against an independent decode of the same bytes: num_tokens() is
// the token count the format implies, read() returns exactly the little-endian tokens after the header(s) (shards
// in order), every id is below vocab_size() = max id + 1 (and below vocab_limit when set). When a Sampler accepts
// the split, filled rows are windows of that stream: targets are inputs shifted by one. A broken promise is
// __builtin_trap().
//
// Build and run (Clang only; see the top-level CMakeLists.txt):
//   CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DMS_BUILD_FUZZERS=ON -DMS_ENABLE_CUDA=OFF
//   ninja -C build-fuzz fuzz_data && ./build-fuzz/fuzz_data -max_total_time=20 build-fuzz/seeds/data
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/data/dataset.h"

namespace {

#define FUZZ_CHECK(cond)               \
    do {                               \
        if (!(cond)) __builtin_trap(); \
    } while (0)

constexpr const char* kFormats[3] = {"megatron", "llmc", "nanogpt"};
constexpr int kVocabLimits[4] = {0, 257, 50257, 65536};
constexpr const char* kSplits[6] = {"1", "969,30,1", "1,1,1", "0,1", "0,0,1", "1,0"};

// One scratch directory per process, removed at exit.
class ScratchDir {
  public:
    ScratchDir() {
        const char* base = std::getenv("TMPDIR");
        path_ = std::string(base && *base ? base : "/tmp") + "/ms_fuzz_data_XXXXXX";
        if (!::mkdtemp(path_.data())) __builtin_trap();
    }
    ~ScratchDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    ScratchDir(const ScratchDir&) = delete;
    ScratchDir& operator=(const ScratchDir&) = delete;
    const std::string& path() const { return path_; }

  private:
    std::string path_;
};

void write_file(const std::string& path, const uint8_t* data, size_t size) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!f) __builtin_trap();
}

// Little-endian tokens of `file` from byte `header` on, appended to `out` (the reference decode).
void append_tokens(const std::vector<uint8_t>& file, size_t header, int itemsize, std::vector<int64_t>& out) {
    for (size_t at = header; at + itemsize <= file.size(); at += itemsize) {
        if (itemsize == 2) {
            out.push_back(file[at] | file[at + 1] << 8);
        } else {
            int32_t v;
            std::memcpy(&v, &file[at], 4);
            out.push_back(v);
        }
    }
}

void check_source(const ms::TokenSource& src, const std::vector<int64_t>& expected, int vocab_limit) {
    FUZZ_CHECK(src.num_tokens() == static_cast<int64_t>(expected.size()) && src.num_tokens() > 0);
    std::vector<int32_t> got(expected.size());
    src.read(0, src.num_tokens(), got.data());
    int64_t max_id = -1;
    for (size_t i = 0; i < got.size(); ++i) {
        FUZZ_CHECK(got[i] == expected[i] && got[i] >= 0);
        max_id = std::max<int64_t>(max_id, got[i]);
    }
    FUZZ_CHECK(src.vocab_size() == max_id + 1);
    FUZZ_CHECK(vocab_limit == 0 || src.vocab_size() <= vocab_limit);
    (void)src.describe();
    (void)src.fingerprint();
    (void)src.decode(std::vector<int32_t>(got.begin(), got.begin() + std::min<size_t>(got.size(), 64)));
}

void check_sampler(const ms::TokenSource& src, const char* split, int T) {
    try {
        const ms::Sampler sampler(src, split, ms::Split::kTrain, T, /*seed=*/1234);
        const int64_t n = sampler.num_samples();
        FUZZ_CHECK(n >= 1 && n * T < src.num_tokens());
        constexpr int64_t kRows = 3;
        std::vector<int32_t> inputs(kRows * T), targets(kRows * T);
        for (int64_t first : {int64_t{0}, 5 * n - 1}) {  // the first epoch, and a window across epochs 4 and 5
            sampler.fill(first, kRows, inputs.data(), targets.data());
            for (int64_t r = 0; r < kRows; ++r) {
                FUZZ_CHECK(sampler.sample_at(first + r) < n);
                for (int t = 0; t + 1 < T; ++t) FUZZ_CHECK(targets[r * T + t] == inputs[r * T + t + 1]);
            }
        }
    } catch (const ms::UserError&) {
        // a split too small for one sample
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 5) return 0;
    const int format = (data[0] & 3) % 3;
    const bool two_files = (data[0] >> 2) & 1;
    const int vocab_limit = kVocabLimits[(data[0] >> 3) % 4];
    const int T = 1 + data[1] % 64;
    const char* split = kSplits[data[2] % 6];
    const size_t first_len = std::min<size_t>(size_t{data[3]} | size_t{data[4]} << 8, size - 5);
    const std::vector<uint8_t> first(data + 5, data + 5 + first_len), second(data + 5 + first_len, data + size);

    static const ScratchDir scratch;
    const std::string& dir = scratch.path();
    ms::set_log_rank(0, false);  // open_nanogpt's note on every open would flood the fuzzer's output
    for (const char* name : {"d.idx", "d.bin", "shard_0.bin", "shard_1.bin"}) ::unlink((dir + "/" + name).c_str());
    ms::DataConfig cfg;
    cfg.source = kFormats[format];
    cfg.split = split;
    std::vector<int64_t> expected;
    if (format == 0) {
        write_file(dir + "/d.idx", first.data(), first.size());
        write_file(dir + "/d.bin", second.data(), second.size());
        cfg.data_path = {dir + "/d"};
        // tokens: the whole .bin, in the dtype the index declares (only read when the open succeeds)
        append_tokens(second, 0, first.size() > 17 && first[17] == 4 ? 4 : 2, expected);
    } else {
        write_file(dir + "/shard_0.bin", first.data(), first.size());
        if (two_files) write_file(dir + "/shard_1.bin", second.data(), second.size());
        cfg.data_path = {dir + "/shard_*.bin"};
        const size_t header = format == 1 ? 1024 : 0;
        append_tokens(first, header, 2, expected);
        if (two_files) append_tokens(second, header, 2, expected);
    }

    std::unique_ptr<ms::TokenSource> src;
    try {
        src = ms::open_token_source(cfg, vocab_limit);
    } catch (const ms::UserError&) {
        return 0;  // the only acceptable failure
    }
    check_source(*src, expected, vocab_limit);
    check_sampler(*src, split, T);
    return 0;
}
