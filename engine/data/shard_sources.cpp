// shard_sources.cpp: llm.c token shards and nanoGPT flat .bin files (docs/formats.md).
//
// llm.c shard: 256 x int32 header {20240520 magic, 1 version, ntok, 0...}, then ntok uint16 tokens;
//              file size == 1024 + 2 * ntok. Shards matching data.data_path are concatenated in sorted order.
// nanoGPT:     headerless uint16 tokens; ntok = file size / 2. Nothing but the size parity and the token ids can
//              be checked, which open_nanogpt says once in the log.
#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/data/file_source.h"

namespace ms::data {
namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;
constexpr int32_t kLlmcLlama3Magic = 20240801;  // uint32-token variant, not read by llm.c's dataloader either
constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

const char* kPathHint = "data.data_path lists the files (glob patterns allowed), e.g. [data/fineweb_train_*.bin]";

// Scans a segment and throws naming the file and position of the first bad id.
int32_t scan_or_throw(const TokenSegment& seg, int vocab_limit, const char* what) {
    const TokenScan scan = scan_tokens(seg, vocab_limit);
    if (scan.bad_index >= 0) {
        throw_bad_token(scan, fmt::format("{} '{}' at token {}", what, seg.file.path(), scan.bad_index), vocab_limit);
    }
    return scan.max_id;
}

std::string describe_files(const char* format, const std::vector<TokenSegment>& segments, int64_t tokens,
                           int32_t max_id) {
    uint64_t bytes = 0;
    for (const TokenSegment& s : segments) bytes += s.file.size();
    const std::string files = segments.size() == 1
                                  ? segments[0].file.path()
                                  : fmt::format("{} files {} .. {}", segments.size(), segments.front().file.path(),
                                                segments.back().file.path());
    return fmt::format("{} {} ({}, uint16): {} tokens, max id {}", format, files, human_bytes(bytes), tokens, max_id);
}

}  // namespace

std::unique_ptr<TokenSource> open_llmc(const DataConfig& cfg, int vocab_limit) {
    std::vector<TokenSegment> segments;
    int32_t max_id = -1;
    int64_t total = 0;
    for (const std::string& path : expand_paths(cfg.data_path, "llmc")) {
        MappedFile file(path, "llm.c shard", kPathHint);
        auto fail = [&](const std::string& problem, const std::string& hint) {
            throw UserError(fmt::format("data error: llm.c shard '{}' {}; hint: {}", path, problem, hint));
        };
        const char* regenerate =
            "the shard is truncated or corrupt -- copy it again or regenerate it with llm.c's "
            "dev/data scripts";
        if (file.size() < kLlmcHeaderBytes) {
            fail(fmt::format("is truncated: {} bytes, shorter than the 1024-byte header", file.size()), regenerate);
        }
        const auto magic = file.load<int32_t>(0);
        const auto version = file.load<int32_t>(4);
        const auto ntok = file.load<int32_t>(8);
        if (magic == kLlmcLlama3Magic) {
            fail(fmt::format("has magic {} (the llama-3 uint32 variant), which is not supported", magic),
                 "write GPT-2 uint16 shards (magic 20240520)");
        }
        if (magic != kLlmcMagic) {
            fail(fmt::format("has a bad magic {} (expected {})", magic, kLlmcMagic),
                 "this is not an llm.c token shard; for a headerless uint16 file use data.source=nanogpt");
        }
        if (version != kLlmcVersion) {
            fail(fmt::format("has version {}, but only version {} is supported", version, kLlmcVersion), regenerate);
        }
        if (ntok < 0) fail(fmt::format("declares a negative token count {}", ntok), regenerate);
        const uint64_t expect = kLlmcHeaderBytes + 2 * static_cast<uint64_t>(ntok);
        if (file.size() != expect) {
            fail(fmt::format("has {} bytes, but its header declares {} tokens: the size must be 1024 + 2*{} = {} ({})",
                             file.size(), ntok, ntok, expect, file.size() < expect ? "truncated" : "trailing bytes"),
                 regenerate);
        }
        TokenSegment seg{std::move(file), kLlmcHeaderBytes, TokenDtype::kUint16, ntok};
        max_id = std::max(max_id, scan_or_throw(seg, vocab_limit, "llm.c shard"));
        total += ntok;
        segments.push_back(std::move(seg));
    }
    if (total == 0) {
        throw UserError(
            fmt::format("data error: the llm.c shards in data.data_path hold no tokens ({} files); hint: {}",
                        segments.size(), kPathHint));
    }
    std::string description = describe_files("llmc", segments, total, max_id);
    return std::make_unique<FileTokenSource>("llmc", std::move(description), std::move(segments), max_id);
}

std::unique_ptr<TokenSource> open_nanogpt(const DataConfig& cfg, int vocab_limit) {
    std::vector<TokenSegment> segments;
    int32_t max_id = -1;
    int64_t total = 0;
    for (const std::string& path : expand_paths(cfg.data_path, "nanogpt")) {
        MappedFile file(path, "nanoGPT token file", kPathHint);
        if (file.size() % 2 != 0) {
            throw UserError(fmt::format(
                "data error: nanoGPT token file '{}' has an odd size of {} bytes, but it must hold whole uint16 "
                "tokens; "
                "hint: the file is truncated, or it is not a headerless uint16 file (llm.c shards: data.source=llmc; "
                "Megatron .bin/.idx: data.source=megatron)",
                path, file.size()));
        }
        if (file.size() == 0) {
            throw UserError(fmt::format("data error: nanoGPT token file '{}' is empty; hint: {}", path, kPathHint));
        }
        const auto ntok = static_cast<int64_t>(file.size() / 2);
        TokenSegment seg{std::move(file), 0, TokenDtype::kUint16, ntok};
        max_id = std::max(max_id, scan_or_throw(seg, vocab_limit, "nanoGPT token file"));
        total += ntok;
        segments.push_back(std::move(seg));
    }
    log_info(
        "note: data.source=nanogpt files have no header, so they cannot be validated beyond their size parity and "
        "token ids (max id {}); make sure they hold uint16 tokens of this model's vocabulary",
        max_id);
    std::string description = describe_files("nanogpt", segments, total, max_id);
    return std::make_unique<FileTokenSource>("nanogpt", std::move(description), std::move(segments), max_id);
}

}  // namespace ms::data
