// byte_tokenizer.cpp: the built-in byte-level tokenizer and `preprocess` (text -> Megatron .bin/.idx).
//
// Tokens: ids 0..255 are the bytes of the text, 256 (kByteEod) ends a document; vocabulary 257.
// Documents: maximal runs of non-blank lines (a blank line is empty or only spaces/tabs/CR); one or more blank
// lines separate documents. A document's tokens are its lines joined by '\n' (bytes kept verbatim), then EOD.
// Output: <output_prefix>_text_document.{bin,idx} in Megatron MMIDIDX v1 with dtype code 8 (uint16), one sequence
// per document, document_indices = [0, 1, ..., D] (the layout is in megatron_source.cpp). The .bin is streamed;
// both files are written to "<path>.tmp" and renamed into place, so a crash never leaves a half-written dataset.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "engine/core/check.h"
#include "engine/data/dataset.h"

namespace ms {
namespace {

bool is_blank(const std::string& line) { return line.find_first_not_of(" \t\r") == std::string::npos; }

// A file written through a temporary name; commit() renames it into place, the destructor removes a leftover.
class AtomicFile {
  public:
    explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
        f_ = std::fopen(tmp_.c_str(), "wb");
        if (!f_) fail("cannot create");
    }
    ~AtomicFile() {
        if (f_) std::fclose(f_);
        if (!committed_) std::remove(tmp_.c_str());
    }
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    void write(const void* p, size_t n) {
        if (n > 0 && std::fwrite(p, 1, n, f_) != n) fail("cannot write");
    }
    template <typename T>
    void put(const T& v) {
        write(&v, sizeof(v));
    }
    void commit() {
        const int rc = std::fclose(f_);
        f_ = nullptr;
        if (rc != 0) fail("cannot write");
        if (std::rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot rename into place");
        committed_ = true;
    }

  private:
    [[noreturn]] void fail(const char* what) {
        throw UserError(
            fmt::format("preprocess error: {} '{}': {}; hint: check that the output directory is "
                        "writable and has free space",
                        what, tmp_, std::strerror(errno)));
    }
    std::string path_, tmp_;
    std::FILE* f_ = nullptr;
    bool committed_ = false;
};

}  // namespace

std::vector<int32_t> byte_encode(const std::string& text) {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<uint8_t>(text[i]);
    return ids;
}

std::string byte_decode(const std::vector<int32_t>& ids) {
    std::string text;
    text.reserve(ids.size());
    for (int32_t id : ids) {
        if (id >= 0 && id < 256) {
            text += static_cast<char>(static_cast<uint8_t>(id));
        } else {
            text += id == kByteEod ? '\n' : '?';
        }
    }
    return text;
}

PreprocessStats preprocess_text(const std::string& input_path, const std::string& output_prefix) {
    std::ifstream in(input_path, std::ios::binary);
    if (!in) {
        throw UserError(
            fmt::format("preprocess error: cannot open input '{}': {}; hint: pass a UTF-8/ASCII text "
                        "file; documents are separated by blank lines",
                        input_path, std::strerror(errno)));
    }
    PreprocessStats stats;
    stats.prefix = output_prefix + "_text_document";
    const std::filesystem::path parent = std::filesystem::path(stats.prefix).parent_path();
    if (!parent.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(parent, ec);
        if (ec) {
            throw UserError(fmt::format("preprocess error: cannot create the output directory '{}': {}",
                                        parent.string(), ec.message()));
        }
    }

    std::vector<int32_t> lengths;  // tokens per document (EOD included)
    {
        AtomicFile bin(stats.prefix + ".bin");
        std::vector<uint16_t> buf;
        int64_t doc_tokens = 0;
        auto end_document = [&] {
            if (doc_tokens == 0) return;
            const uint16_t eod = kByteEod;
            bin.put(eod);
            ++doc_tokens;
            if (doc_tokens > std::numeric_limits<int32_t>::max()) {
                throw UserError(
                    fmt::format("preprocess error: document {} of '{}' has {} bytes, more than the int32 "
                                "sequence length of the Megatron format allows; hint: separate it into "
                                "documents with blank lines",
                                lengths.size(), input_path, doc_tokens - 1));
            }
            lengths.push_back(static_cast<int32_t>(doc_tokens));
            stats.tokens += doc_tokens;
            doc_tokens = 0;
        };
        std::string line;
        while (std::getline(in, line)) {
            if (is_blank(line)) {
                end_document();
                continue;
            }
            buf.clear();
            if (doc_tokens > 0) buf.push_back('\n');  // the newline between two lines of one document
            for (char c : line) buf.push_back(static_cast<uint8_t>(c));
            bin.write(buf.data(), buf.size() * sizeof(uint16_t));
            doc_tokens += static_cast<int64_t>(buf.size());
        }
        if (in.bad()) {
            throw UserError(fmt::format("preprocess error: reading '{}' failed: {}", input_path, std::strerror(errno)));
        }
        end_document();
        stats.documents = static_cast<int64_t>(lengths.size());
        if (stats.documents == 0) {
            throw UserError(
                fmt::format("preprocess error: input '{}' has no text (it is empty or only blank lines); "
                            "hint: pass a non-empty text file",
                            input_path));
        }
        bin.commit();
    }

    AtomicFile idx(stats.prefix + ".idx");
    const char magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
    idx.write(magic, sizeof(magic));
    idx.put(uint64_t{1});  // version
    idx.put(uint8_t{8});   // dtype code: uint16
    const auto n = static_cast<uint64_t>(lengths.size());
    idx.put(n);      // sequence_count
    idx.put(n + 1);  // document_count: length of document_indices, leading 0 included
    idx.write(lengths.data(), lengths.size() * sizeof(int32_t));
    int64_t pointer = 0;
    for (int32_t len : lengths) {
        idx.put(pointer);
        pointer += int64_t{len} * 2;
    }
    for (uint64_t d = 0; d <= n; ++d) idx.put(static_cast<int64_t>(d));
    idx.commit();
    return stats;
}

}  // namespace ms
