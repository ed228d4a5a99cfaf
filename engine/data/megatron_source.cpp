// megatron_source.cpp: open and validate a Megatron MMapIndexedDataset (<prefix>.idx + <prefix>.bin).
//
// .idx layout (MMIDIDX v1, little-endian; docs/formats.md):
//   0        9   magic "MMIDIDX\0\0"
//   9        8   u64 version (1)
//   17       1   u8 dtype code (1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16); we read 8 and 4
//   18       8   u64 sequence_count N
//   26       8   u64 document_count D (length of document_indices, leading 0 included)
//   34       4N  i32 sequence_lengths
//   34+4N    8N  i64 sequence_pointers (byte offsets into .bin)
//   34+12N   8D  i64 document_indices (0, ..., N; monotone)
//   [34+12N+8D  N  i8 sequence_modes, multimodal only: ignored]
// .bin: the tokens of every sequence, concatenated, no header.
//
// Every field is checked against the others and against the .bin size before a token is read, so a truncated
// or mismatched pair of files is reported at open, not as garbage samples (or a SIGBUS) hours later.
#include <algorithm>
#include <cstring>

#include "engine/core/check.h"
#include "engine/data/file_source.h"

namespace ms::data {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeaderBytes = 34;
// Sequence and document counts above this cannot describe a real file and would overflow 34 + 12N + 8D.
constexpr uint64_t kMaxCount = uint64_t{1} << 56;

const char* dtype_code_name(uint8_t code) {
    switch (code) {
        case 1:
            return "uint8";
        case 2:
            return "int8";
        case 3:
            return "int16";
        case 4:
            return "int32";
        case 5:
            return "int64";
        case 6:
            return "float64";
        case 7:
            return "float32";
        case 8:
            return "uint16";
        default:
            return nullptr;
    }
}

std::string strip_suffix(const std::string& s, const std::string& suffix) {
    if (s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0) {
        return s.substr(0, s.size() - suffix.size());
    }
    return s;
}

[[noreturn]] void idx_error(const std::string& path, const std::string& problem, const std::string& hint) {
    throw UserError(fmt::format("data error: Megatron index '{}' {}; hint: {}", path, problem, hint));
}

const char* kRegenerate =
    "the file is truncated or corrupt -- copy it again or regenerate it with "
    "tools/preprocess_data.py (or `mindspeed-train preprocess`)";

}  // namespace

std::unique_ptr<TokenSource> open_megatron(const DataConfig& cfg, int vocab_limit) {
    if (cfg.data_path.empty()) {
        throw UserError(
            "config error: data.data_path is empty, but data.source=megatron needs the dataset prefix; "
            "hint: --set data.data_path=[data/my_text_document] (the path without .bin/.idx)");
    }
    if (cfg.data_path.size() > 1) {
        throw UserError(fmt::format(
            "config error: data.data_path has {} entries for data.source=megatron, but blending is not supported yet; "
            "hint: give one prefix (without weights), e.g. --set data.data_path=[data/my_text_document]",
            cfg.data_path.size()));
    }
    const std::string& prefix = cfg.data_path[0];
    const std::string idx_path = prefix + ".idx";
    const std::string bin_path = prefix + ".bin";
    std::string hint = "data.data_path for megatron is the prefix without .bin/.idx, e.g. data/my_text_document";
    const std::string stripped = strip_suffix(strip_suffix(prefix, ".bin"), ".idx");
    if (stripped != prefix) hint = fmt::format("drop the extension: --set data.data_path=[{}]", stripped);

    MappedFile idx(idx_path, "Megatron index", hint);
    MappedFile bin(bin_path, "Megatron data file", hint);

    // ---- fixed header ----
    if (idx.size() < kHeaderBytes) {
        idx_error(idx_path, fmt::format("is truncated: {} bytes, shorter than the 34-byte header", idx.size()),
                  kRegenerate);
    }
    if (std::memcmp(idx.data(), kMagic, sizeof(kMagic)) != 0) {
        idx_error(idx_path, "has a bad magic (expected \"MMIDIDX\\0\\0\" in the first 9 bytes)",
                  "this is not a Megatron MMapIndexedDataset .idx file; check data.source and data.data_path");
    }
    const auto version = idx.load<uint64_t>(9);
    if (version != 1) {
        idx_error(idx_path, fmt::format("has version {}, but only version 1 is supported", version),
                  "regenerate the data with Megatron-LM's tools/preprocess_data.py");
    }
    const uint8_t code = idx.load<uint8_t>(17);
    TokenDtype dtype;
    if (code == 8) {
        dtype = TokenDtype::kUint16;
    } else if (code == 4) {
        dtype = TokenDtype::kInt32;
    } else if (const char* name = dtype_code_name(code)) {
        idx_error(
            idx_path,
            fmt::format("has dtype code {} ({}), which is not supported (only 8 = uint16 and 4 = int32)", code, name),
            "re-tokenize the data; preprocess_data.py picks uint16 for vocabularies < 65500, int32 above");
    } else {
        idx_error(idx_path, fmt::format("has unknown dtype code {} (valid codes are 1..8)", code), kRegenerate);
    }
    const size_t item = static_cast<size_t>(itemsize(dtype));
    const auto n_seq = idx.load<uint64_t>(18);
    const auto n_doc = idx.load<uint64_t>(26);
    if (n_seq > kMaxCount || n_doc > kMaxCount) {
        idx_error(idx_path,
                  fmt::format("declares {} sequences and {} document indices, which is impossible", n_seq, n_doc),
                  kRegenerate);
    }
    const uint64_t need = kHeaderBytes + 12 * n_seq + 8 * n_doc;
    if (idx.size() < need) {
        idx_error(idx_path,
                  fmt::format("is truncated: {} bytes, but its header declares {} sequences and {} document indices, "
                              "which need 34 + 12*{} + 8*{} = {} bytes",
                              idx.size(), n_seq, n_doc, n_seq, n_doc, need),
                  kRegenerate);
    }

    // ---- arrays ----
    const size_t len_off = kHeaderBytes;
    const size_t ptr_off = kHeaderBytes + 4 * n_seq;
    const size_t doc_off = kHeaderBytes + 12 * n_seq;
    if (n_doc < 1 || idx.load<int64_t>(doc_off) != 0) {
        idx_error(idx_path, "has document_indices that do not start with 0", kRegenerate);
    }
    int64_t prev_doc = 0;
    for (uint64_t d = 1; d < n_doc; ++d) {
        const auto v = idx.load<int64_t>(doc_off + 8 * d);
        if (v < prev_doc || static_cast<uint64_t>(v) > n_seq) {
            idx_error(idx_path,
                      fmt::format("has document_indices[{}] = {} after {}; they must be non-decreasing and <= the "
                                  "sequence count {}",
                                  d, v, prev_doc, n_seq),
                      kRegenerate);
        }
        prev_doc = v;
    }
    if (static_cast<uint64_t>(prev_doc) != n_seq) {
        idx_error(idx_path,
                  fmt::format("has a last document index {}, but {} sequences: every sequence must belong to a "
                              "document",
                              prev_doc, n_seq),
                  kRegenerate);
    }
    uint64_t expected_ptr = 0;
    for (uint64_t i = 0; i < n_seq; ++i) {
        const auto len = idx.load<int32_t>(len_off + 4 * i);
        const auto ptr = idx.load<int64_t>(ptr_off + 8 * i);
        if (len < 0) {
            idx_error(idx_path, fmt::format("has a negative length {} for sequence {}", len, i), kRegenerate);
        }
        if (ptr < 0 || static_cast<uint64_t>(ptr) != expected_ptr) {
            idx_error(idx_path,
                      fmt::format("has sequence_pointers[{}] = {}, but the lengths before it put sequence {} at byte "
                                  "{} of the .bin",
                                  i, ptr, i, expected_ptr),
                      kRegenerate);
        }
        expected_ptr += static_cast<uint64_t>(len) * item;
    }
    if (bin.size() != expected_ptr) {
        throw UserError(fmt::format(
            "data error: Megatron data file '{}' has {} bytes, but its index '{}' describes {} sequences ending at "
            "byte "
            "{} ({} tokens of {}): the .bin is {}; hint: the .bin and .idx must come from the same preprocessing run "
            "-- copy them again or regenerate them",
            bin_path, bin.size(), idx_path, n_seq, expected_ptr, expected_ptr / item, dtype_name(dtype),
            bin.size() < expected_ptr ? "truncated" : "longer than its index"));
    }
    if (expected_ptr == 0) {
        throw UserError(
            fmt::format("data error: Megatron dataset '{}' holds no tokens ({} sequences, all empty); "
                        "hint: preprocess a non-empty corpus",
                        prefix, n_seq));
    }

    TokenSegment seg{std::move(bin), 0, dtype, static_cast<int64_t>(expected_ptr / item)};
    const TokenScan scan = scan_tokens(seg, vocab_limit);
    if (scan.bad_index >= 0) {
        // locate the sequence holding the bad token (pointers are validated: sequences are contiguous)
        uint64_t s = 0;
        int64_t start = 0;
        for (;; ++s) {
            const int64_t len = idx.load<int32_t>(len_off + 4 * s);
            if (scan.bad_index < start + len) break;
            start += len;
        }
        throw_bad_token(scan,
                        fmt::format("Megatron data file '{}' at token {} (sequence {}, token {} of it)", bin_path,
                                    scan.bad_index, s, scan.bad_index - start),
                        vocab_limit);
    }
    std::string description =
        fmt::format("megatron {} ({}, {}): {} tokens in {} sequences / {} documents, max id {}", prefix,
                    human_bytes(seg.file.size()), dtype_name(dtype), seg.num_tokens, n_seq, n_doc - 1, scan.max_id);
    std::vector<TokenSegment> segments;
    segments.push_back(std::move(seg));
    return std::make_unique<FileTokenSource>("megatron", std::move(description), std::move(segments), scan.max_id);
}

}  // namespace ms::data
