// preprocess.cpp: preprocess (preprocess.h) -- read documents in batches, encode each batch on worker threads,
// write every key's dataset in input order; the Megatron .bin is streamed and both files are written to
// "<path>.tmp" and renamed into place, so a crash never leaves a half-written dataset.
#include "engine/data/preprocess.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/core/check.h"
#include "engine/data/dataset.h"
#include "engine/data/gpt2_bpe.h"

namespace ms {
namespace {

constexpr size_t kBatchDocuments = 4096;         // documents read before a batch is encoded
constexpr size_t kBatchBytes = size_t{1} << 20;  // or this many bytes of text (a progress step)
constexpr int64_t kUint16Vocab = 65500;          // Megatron's DType.optimal_dtype: uint16 below, int32 from here

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

// One key's dataset: the .bin streamed as documents arrive, the .idx written at the end.
class DatasetWriter {
  public:
    DatasetWriter(PreprocessOutput& out, bool wide) : out_(out), wide_(wide), bin_(out.prefix + ".bin") {}

    void add(const std::vector<int32_t>& ids, const std::string& input_path) {
        if (ids.empty()) {
            ++out_.empty_documents;
            return;
        }
        if (ids.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
            throw UserError(
                fmt::format("preprocess error: document {} of '{}' has {} tokens, more than the int32 "
                            "sequence length of the Megatron format allows; hint: separate it into "
                            "documents",
                            lengths_.size(), input_path, ids.size()));
        }
        if (wide_) {
            bin_.write(ids.data(), ids.size() * sizeof(int32_t));
        } else {
            narrow_.assign(ids.begin(), ids.end());  // ids < kUint16Vocab: the tokenizer's vocabulary is smaller
            bin_.write(narrow_.data(), narrow_.size() * sizeof(uint16_t));
        }
        lengths_.push_back(static_cast<int32_t>(ids.size()));
        out_.tokens += static_cast<int64_t>(ids.size());
        ++out_.documents;
    }

    void commit() {
        bin_.commit();
        AtomicFile idx(out_.prefix + ".idx");
        const char magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
        idx.write(magic, sizeof(magic));
        idx.put(uint64_t{1});                      // version
        idx.put(wide_ ? uint8_t{4} : uint8_t{8});  // dtype code: int32 or uint16
        const auto n = static_cast<uint64_t>(lengths_.size());
        idx.put(n);      // sequence_count
        idx.put(n + 1);  // document_count: length of document_indices, leading 0 included
        idx.write(lengths_.data(), lengths_.size() * sizeof(int32_t));
        int64_t pointer = 0;
        for (const int32_t len : lengths_) {
            idx.put(pointer);
            pointer += int64_t{len} * (wide_ ? 4 : 2);
        }
        for (uint64_t d = 0; d <= n; ++d) idx.put(static_cast<int64_t>(d));
        idx.commit();
    }

  private:
    PreprocessOutput& out_;
    bool wide_;
    AtomicFile bin_;
    std::vector<int32_t> lengths_;  // tokens per document
    std::vector<uint16_t> narrow_;
};

// The documents of the input, one record (a text per key) at a time.
class DocumentReader {
  public:
    DocumentReader(const PreprocessOptions& o) : path_(o.input), keys_(o.json_keys), in_(o.input, std::ios::binary) {
        if (!in_) {
            throw UserError(
                fmt::format("preprocess error: cannot open input '{}': {}; hint: pass a UTF-8/ASCII text "
                            "file; documents are separated by blank lines",
                            path_, std::strerror(errno)));
        }
    }
    // The next record into `texts` (one per key); false at the end of the input.
    bool next(std::vector<std::string>& texts) {
        const bool more = keys_.empty() ? next_paragraph(texts) : next_json_line(texts);
        if (in_.bad())
            throw UserError(fmt::format("preprocess error: reading '{}' failed: {}", path_, std::strerror(errno)));
        return more;
    }
    int64_t bytes_read() const { return bytes_; }

  private:
    bool read_line() {
        if (!std::getline(in_, line_)) return false;
        bytes_ += static_cast<int64_t>(line_.size()) + 1;
        ++line_no_;
        return true;
    }

    bool next_paragraph(std::vector<std::string>& texts) {
        texts.assign(1, {});
        std::string& doc = texts[0];
        bool any = false;
        while (read_line()) {
            if (is_blank(line_)) {
                if (any) return true;
                continue;
            }
            if (any) doc += '\n';  // the newline between two lines of one document
            doc += line_;
            any = true;
        }
        return any;
    }

    bool next_json_line(std::vector<std::string>& texts) {
        do {
            if (!read_line()) return false;
        } while (is_blank(line_));
        const std::string hint =
            "\n---> HINT: a JSON Lines input holds one JSON object per line, e.g. {\"text\": \"...\"}; a plain "
            "text file (documents separated by blank lines) is read without --json-keys";
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(line_);
        } catch (const nlohmann::json::parse_error& e) {
            throw UserError(fmt::format("preprocess error: line {} of '{}' is not valid JSON ({}){}", line_no_, path_,
                                        e.what(), hint));
        }
        if (!j.is_object())
            throw UserError(fmt::format("preprocess error: line {} of '{}' is a JSON {}, not an object{}", line_no_,
                                        path_, j.type_name(), hint));
        texts.assign(keys_.size(), {});
        for (size_t k = 0; k < keys_.size(); ++k) {
            const auto it = j.find(keys_[k]);
            if (it == j.end()) {
                std::string present;
                for (const auto& [key, value] : j.items()) present += (present.empty() ? "" : ", ") + key;
                throw UserError(
                    fmt::format("preprocess error: line {} of '{}' has no key '{}' (its keys: {})\n---> HINT: "
                                "name keys that every line holds with --json-keys (Megatron's default is text)",
                                line_no_, path_, keys_[k], present.empty() ? "none" : present));
            }
            if (it->is_string()) {
                texts[k] = it->get<std::string>();
                continue;
            }
            bool strings = it->is_array();
            for (const auto& part : *it) strings = strings && part.is_string();
            if (!strings)
                throw UserError(
                    fmt::format("preprocess error: line {} of '{}': the value of '{}' is a JSON {}, not a "
                                "string or a list of strings{}",
                                line_no_, path_, keys_[k], it->type_name(), hint));
            for (const auto& part : *it) texts[k] += part.get<std::string>();
        }
        return true;
    }

    std::string path_;
    std::vector<std::string> keys_;
    std::ifstream in_;
    std::string line_;
    int64_t line_no_ = 0, bytes_ = 0;
};

// ids[r][k] = the tokens of texts[r][k], records spread over one thread per cache.
std::vector<std::vector<std::vector<int32_t>>> encode_batch(const std::vector<std::vector<std::string>>& texts,
                                                            const DocumentTokenizer& tokenizer, bool append_eod,
                                                            std::vector<Gpt2Bpe::PieceCache>& caches) {
    std::vector<std::vector<std::vector<int32_t>>> ids(texts.size());
    const auto work = [&](size_t first, size_t stride) {
        Gpt2Bpe::PieceCache& cache = caches[first];
        for (size_t r = first; r < texts.size(); r += stride) {
            ids[r].resize(texts[r].size());
            for (size_t k = 0; k < texts[r].size(); ++k) {
                ids[r][k] = tokenizer.encode(texts[r][k], cache);
                if (append_eod && !ids[r][k].empty()) ids[r][k].push_back(*tokenizer.end_of_document);
            }
        }
    };
    const size_t threads = caches.size();
    if (threads == 1) {
        work(0, 1);
        return ids;
    }
    std::vector<std::exception_ptr> errors(threads);
    std::vector<std::thread> pool;
    for (size_t t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            try {
                work(t, threads);
            } catch (...) {
                errors[t] = std::current_exception();
            }
        });
    for (std::thread& th : pool) th.join();
    for (const std::exception_ptr& e : errors)
        if (e) std::rethrow_exception(e);
    return ids;
}

}  // namespace

TokenizerType parse_tokenizer_type(const std::string& name) {
    if (name == "byte") return TokenizerType::kByte;
    if (name == "GPT2BPETokenizer") return TokenizerType::kGpt2Bpe;
    if (name == "HuggingFaceTokenizer") return TokenizerType::kHuggingFace;
    throw UserError(
        fmt::format("preprocess error: --tokenizer-type {} is not one of byte, GPT2BPETokenizer (with --vocab-file "
                    "and --merge-file), HuggingFaceTokenizer (with --tokenizer-model tokenizer.json)",
                    name));
}

DocumentTokenizer load_document_tokenizer(TokenizerType type, const std::string& vocab_file,
                                          const std::string& merge_file, const std::string& tokenizer_model) {
    DocumentTokenizer t;
    if (type == TokenizerType::kByte) {
        t.name = "byte";
        t.encode = [](std::string_view text, Gpt2Bpe::PieceCache&) { return byte_encode(std::string(text)); };
        t.vocab_size = kByteVocab;
        t.end_of_document = kByteEod;
        t.always_end_documents = true;
        return t;
    }
    std::shared_ptr<const Gpt2Bpe> bpe;
    if (type == TokenizerType::kGpt2Bpe) {
        if (vocab_file.empty() || merge_file.empty())
            throw UserError(
                "preprocess error: --tokenizer-type GPT2BPETokenizer needs --vocab-file (vocab.json) and "
                "--merge-file (merges.txt)\n---> HINT: Hugging Face ships both with every GPT-2 model");
        t.name = "GPT2BPETokenizer";
        bpe = std::make_shared<const Gpt2Bpe>(Gpt2Bpe::load(vocab_file, merge_file));
    } else {
        if (tokenizer_model.empty())
            throw UserError(
                "preprocess error: --tokenizer-type HuggingFaceTokenizer needs --tokenizer-model "
                "(the model's tokenizer.json)");
        t.name = "HuggingFaceTokenizer";
        bpe = std::make_shared<const Gpt2Bpe>(Gpt2Bpe::from_tokenizer_json(tokenizer_model));
    }
    t.encode = [bpe](std::string_view text, Gpt2Bpe::PieceCache& cache) { return bpe->encode(text, cache); };
    t.vocab_size = bpe->vocab_size();
    t.end_of_document = bpe->end_of_document();
    return t;
}

std::vector<PreprocessOutput> preprocess(const PreprocessOptions& options, const DocumentTokenizer& tokenizer) {
    if (options.append_eod && !tokenizer.end_of_document)
        throw UserError(fmt::format(
            "preprocess error: --append-eod: the {} tokenizer has no end-of-document token (<|endoftext|>, or a "
            "tokenizer.json's eos_token)\n---> HINT: drop --append-eod, or pass the tokenizer files that define it",
            tokenizer.name));
    const bool append_eod = options.append_eod || tokenizer.always_end_documents;
    DocumentReader reader(options);
    std::vector<PreprocessOutput> outputs;
    for (const std::string& key : options.json_keys.empty() ? std::vector<std::string>{"text"} : options.json_keys)
        outputs.push_back({key, options.output_prefix + "_" + key + "_document"});
    const std::filesystem::path parent = std::filesystem::path(outputs[0].prefix).parent_path();
    if (!parent.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(parent, ec);
        if (ec) {
            throw UserError(fmt::format("preprocess error: cannot create the output directory '{}': {}",
                                        parent.string(), ec.message()));
        }
    }
    std::vector<std::unique_ptr<DatasetWriter>> writers;
    for (PreprocessOutput& out : outputs)
        writers.push_back(std::make_unique<DatasetWriter>(out, tokenizer.vocab_size >= kUint16Vocab));

    std::error_code size_error;
    const auto total = static_cast<int64_t>(std::filesystem::file_size(options.input, size_error));
    Progress progress("preprocess", size_error ? 0 : total, options.progress);
    int64_t records = 0;
    std::vector<Gpt2Bpe::PieceCache> caches(static_cast<size_t>(std::max(1, options.workers)));  // one per worker
    std::vector<std::vector<std::string>> batch;
    std::vector<std::string> texts;
    for (bool more = true; more;) {
        batch.clear();
        size_t bytes = 0;
        while (batch.size() < kBatchDocuments && bytes < kBatchBytes && (more = reader.next(texts))) {
            for (const std::string& t : texts) bytes += t.size();
            batch.push_back(std::move(texts));
        }
        const auto ids = encode_batch(batch, tokenizer, append_eod, caches);
        for (const auto& record : ids)
            for (size_t k = 0; k < record.size(); ++k) writers[k]->add(record[k], options.input);
        records += static_cast<int64_t>(batch.size());
        progress.update(reader.bytes_read(), records);
    }
    for (const PreprocessOutput& out : outputs) {
        if (out.documents == 0) {
            throw UserError(fmt::format(
                "preprocess error: input '{}' has no text{} (it is empty or only blank "
                "lines); hint: pass a non-empty text file",
                options.input, options.json_keys.empty() ? "" : fmt::format(" under the key '{}'", out.key)));
        }
    }
    for (const auto& w : writers) w->commit();
    progress.finish();
    return outputs;
}

PreprocessStats preprocess_text(const std::string& input_path, const std::string& output_prefix) {
    PreprocessOptions options;
    options.input = input_path;
    options.output_prefix = output_prefix;
    const PreprocessOutput out = preprocess(options, load_document_tokenizer(TokenizerType::kByte, "", "", "")).front();
    return {out.documents, out.tokens, out.prefix};
}

}  // namespace ms
