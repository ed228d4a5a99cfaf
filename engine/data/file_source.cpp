// file_source.cpp: FileTokenSource (the flat stream over mapped segments), the validation scan, glob expansion
// and open_token_source(), which dispatches on data.source.
#include "engine/data/file_source.h"

#include <glob.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <set>

#include "engine/core/check.h"

namespace ms::data {

static_assert(std::endian::native == std::endian::little, "token files are little-endian; so is this reader");

namespace {

// FNV-1a 64 over raw bytes, continued across calls.
struct Fnv64 {
    uint64_t h = 1469598103934665603ull;
    void bytes(const void* p, size_t n) {
        const auto* b = static_cast<const uint8_t*>(p);
        for (size_t i = 0; i < n; ++i) {
            h ^= b[i];
            h *= 1099511628211ull;
        }
    }
    template <typename T>
    void value(const T& v) {
        bytes(&v, sizeof(v));
    }
};

constexpr int64_t kFingerprintTokens = 16;  // tokens hashed at each end of the stream

}  // namespace

TokenScan scan_tokens(const TokenSegment& seg, int vocab_limit) {
    TokenScan scan;
    const uint8_t* base = seg.file.data() + seg.header_bytes;
    // no limit: the largest vocabulary an int holds (its size, the largest id + 1, must fit too)
    const int64_t limit = vocab_limit > 0 ? vocab_limit : std::numeric_limits<int32_t>::max();
    if (seg.dtype == TokenDtype::kUint16) {
        // uint16 is never negative: the max alone decides, then a second pass finds the first offender.
        uint16_t max_id = 0;
        for (int64_t i = 0; i < seg.num_tokens; ++i) {
            uint16_t v;
            std::memcpy(&v, base + 2 * i, 2);
            max_id = std::max(max_id, v);
        }
        scan.max_id = seg.num_tokens > 0 ? max_id : -1;
        if (scan.max_id >= limit) {
            for (int64_t i = 0; i < seg.num_tokens; ++i) {
                uint16_t v;
                std::memcpy(&v, base + 2 * i, 2);
                if (v >= limit) {
                    scan.bad_index = i;
                    scan.bad_value = v;
                    break;
                }
            }
        }
    } else {
        int32_t max_id = -1;
        for (int64_t i = 0; i < seg.num_tokens; ++i) {
            int32_t v;
            std::memcpy(&v, base + 4 * i, 4);
            if (v < 0 || v >= limit) {
                scan.bad_index = i;
                scan.bad_value = v;
                break;
            }
            max_id = std::max(max_id, v);
        }
        scan.max_id = max_id;
    }
    return scan;
}

void throw_bad_token(const TokenScan& scan, const std::string& where, int vocab_limit) {
    if (scan.bad_value < 0) {
        throw UserError(
            fmt::format("data error: {} has the negative token id {}; token ids must be >= 0; hint: the "
                        "file is corrupt or was written with a different dtype",
                        where, scan.bad_value));
    }
    if (vocab_limit <= 0) {
        throw UserError(
            fmt::format("data error: {} has token id {}, beyond the largest vocabulary a token id can index ({} "
                        "ids); hint: the file is corrupt or was written with a different dtype",
                        where, scan.bad_value, std::numeric_limits<int32_t>::max()));
    }
    throw UserError(fmt::format(
        "data error: {} has token id {}, which is >= the vocabulary size {}; hint: the data was tokenized with a "
        "larger "
        "vocabulary than model.vocab_size -- raise model.vocab_size (0 takes it from the data) or re-tokenize",
        where, scan.bad_value, vocab_limit));
}

FileTokenSource::FileTokenSource(std::string format, std::string description, std::vector<TokenSegment> segments,
                                 int32_t max_id)
    : format_(std::move(format)),
      description_(std::move(description)),
      segments_(std::move(segments)),
      max_id_(max_id) {
    starts_.push_back(0);
    for (const TokenSegment& s : segments_) starts_.push_back(starts_.back() + s.num_tokens);

    // Identity of the contents, not of their location: moving the files keeps the sample order.
    Fnv64 f;
    f.bytes(format_.data(), format_.size());
    for (const TokenSegment& s : segments_) {
        f.value(static_cast<uint64_t>(s.file.size()));
        f.value(s.num_tokens);
    }
    const int64_t n = num_tokens();
    const int64_t head = std::min(n, kFingerprintTokens);
    std::vector<int32_t> sample(static_cast<size_t>(head));
    read(0, head, sample.data());
    f.bytes(sample.data(), sample.size() * sizeof(int32_t));
    const int64_t tail = std::min(n - head, kFingerprintTokens);
    sample.resize(static_cast<size_t>(tail));
    read(n - tail, tail, sample.data());
    f.bytes(sample.data(), sample.size() * sizeof(int32_t));
    fingerprint_ = f.h;
}

void FileTokenSource::read(int64_t offset, int64_t count, int32_t* out) const {
    MS_CHECK(offset >= 0 && count >= 0 && offset + count <= num_tokens(),
             "read of tokens [{}, {}) outside the {} tokens of {}", offset, offset + count, num_tokens(), description_);
    // segment holding `offset`: the last start <= offset
    size_t s = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin()) - 1;
    while (count > 0) {
        const TokenSegment& seg = segments_[s];
        const int64_t local = offset - starts_[s];
        const int64_t n = std::min(count, seg.num_tokens - local);
        const uint8_t* base = seg.file.data() + seg.header_bytes;
        if (seg.dtype == TokenDtype::kUint16) {
            for (int64_t i = 0; i < n; ++i) {
                uint16_t v;
                std::memcpy(&v, base + 2 * (local + i), 2);
                out[i] = v;
            }
        } else {
            std::memcpy(out, base + 4 * local, static_cast<size_t>(n) * 4);
        }
        out += n;
        offset += n;
        count -= n;
        ++s;
    }
}

double FileTokenSource::entropy_rate() const { return std::numeric_limits<double>::quiet_NaN(); }

std::string FileTokenSource::decode(const std::vector<int32_t>& ids) const {
    if (vocab_size() <= kByteVocab) return byte_decode(ids);
    std::string text;
    for (int32_t id : ids) text += fmt::format("[{}]", id);
    return text;
}

std::vector<std::string> expand_paths(const std::vector<std::string>& patterns, const std::string& format) {
    if (patterns.empty()) {
        throw UserError(
            fmt::format("config error: data.data_path is empty, but data.source={} reads files; hint: set "
                        "data.data_path to the file(s) to train on, e.g. --set data.data_path=[data/x.bin]",
                        format));
    }
    std::set<std::string> files;
    for (const std::string& pattern : patterns) {
        glob_t g{};
        const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
        if (rc == 0) {
            for (size_t i = 0; i < g.gl_pathc; ++i) files.insert(g.gl_pathv[i]);
        }
        ::globfree(&g);
        if (rc == GLOB_NOMATCH) {
            const bool is_pattern = pattern.find_first_of("*?[") != std::string::npos;
            throw UserError(fmt::format(
                "data error: data.data_path entry '{}' {}; hint: check the path (relative paths are resolved from the "
                "working directory) and that the files were written",
                pattern, is_pattern ? "matches no files" : "does not exist"));
        }
        if (rc != 0) {
            throw UserError(
                fmt::format("data error: cannot expand data.data_path entry '{}' (glob error {}); hint: "
                            "check that the directories are readable",
                            pattern, rc));
        }
    }
    return {files.begin(), files.end()};  // std::set: sorted, no duplicates
}

std::string human_bytes(uint64_t bytes) {
    if (bytes < 1024) return fmt::format("{} B", bytes);
    const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(bytes) / 1024.0;
    int u = 0;
    while (v >= 1024.0 && u < 3) {
        v /= 1024.0;
        ++u;
    }
    return fmt::format("{:.1f} {}", v, units[u]);
}

}  // namespace ms::data

namespace ms {

std::unique_ptr<TokenSource> open_token_source(const DataConfig& cfg, int vocab_limit) {
    if (cfg.source == "synthetic") return data::open_synthetic(cfg.synthetic, vocab_limit);
    if (cfg.source == "megatron") return data::open_megatron(cfg, vocab_limit);
    if (cfg.source == "llmc") return data::open_llmc(cfg, vocab_limit);
    if (cfg.source == "nanogpt") return data::open_nanogpt(cfg, vocab_limit);
    throw UserError(
        fmt::format("config error: data.source='{}' is not a known source; hint: use one of synthetic, "
                    "megatron, llmc, nanogpt",
                    cfg.source));
}

}  // namespace ms
