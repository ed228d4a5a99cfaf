// hf_tokenizer.cpp: the tokenizer files of a Hugging Face export (hf_tokenizer.h).
#include "engine/ckpt/hf_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/ckpt/atomic_dir.h"
#include "engine/core/check.h"
#include "engine/data/dataset.h"
#include "engine/data/gpt2_bpe.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw UserError(fmt::format("tokenizer error: cannot open '{}'", path));
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// The merges.txt lines Gpt2Bpe reads ("#version" header and blank lines skipped), as "left right" strings.
json merges_list(const std::string& text) {
    json out = json::array();
    std::istringstream in(text);
    size_t line_no = 0;
    for (std::string line; std::getline(in, line);) {
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
        out.push_back(line);
    }
    return out;
}

constexpr const char* kEndOfText = "<|endoftext|>";  // the byte tokenizer's end of document (256), as text

// Hugging Face's ByteLevel pre-tokenizer (and decoder): GPT-2's regex first (use_regex), or the whole text as one
// piece; either way each byte becomes its symbol in GPT-2's byte alphabet.
json byte_level(bool use_regex) {
    return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

// A byte-level BPE tokenizer.json (the layout of the hub's gpt2/tokenizer.json), with `eos` as a special added
// token when there is one.
json bpe_tokenizer_json(const json& vocab, const json& merges, const json& pre_tokenizer, std::optional<int32_t> eos,
                        const std::string& eos_text) {
    json added = json::array();
    if (eos)
        added.push_back({{"id", *eos},
                         {"content", eos_text},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", false},
                         {"special", true}});
    return {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", added},
            {"normalizer", nullptr},
            {"pre_tokenizer", pre_tokenizer},
            {"post_processor",
             {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", true}}},
            {"decoder", byte_level(true)},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", nullptr},
              {"continuing_subword_prefix", ""},
              {"end_of_word_suffix", ""},
              {"fuse_unk", false},
              {"byte_fallback", false},
              {"vocab", vocab},
              {"merges", merges}}}};
}

// The byte tokenizer (dataset.h) as a tokenizer.json: byte b is the id b, through its symbol in the byte alphabet
// (a BPE without merges leaves every byte its own symbol, Gpt2Bpe::bpe).
json byte_tokenizer_json() {
    const Gpt2Bpe no_merges = Gpt2Bpe::from_strings(R"({"a": 0})", "", "the byte alphabet");
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) vocab[no_merges.bpe(std::string(1, static_cast<char>(b))).at(0)] = b;
    vocab[kEndOfText] = kByteEod;
    return bpe_tokenizer_json(vocab, json::array(), byte_level(false), kByteEod, kEndOfText);
}

}  // namespace

HfTokenizerExport export_hf_tokenizer(const HfTokenizerSource& src, int64_t model_vocab_size, int64_t model_max_length,
                                      const std::string& out_dir) {
    const bool gpt2_files = !src.vocab_file.empty() || !src.merge_file.empty();
    const TokenizerType type =
        src.type ? *src.type : (gpt2_files ? TokenizerType::kGpt2Bpe : TokenizerType::kHuggingFace);
    const std::string hint =
        "\n---> HINT: give the tokenizer the data was preprocessed with, as preprocess took it: --tokenizer-type "
        "byte, --vocab-file vocab.json --merge-file merges.txt (GPT2BPETokenizer), or --tokenizer-model "
        "tokenizer.json (HuggingFaceTokenizer)";
    if ((type != TokenizerType::kGpt2Bpe && gpt2_files) ||
        (type != TokenizerType::kHuggingFace && !src.tokenizer_json.empty()))
        throw UserError("command line error: convert takes one tokenizer, and only the files of its type" + hint);
    if (type == TokenizerType::kGpt2Bpe && (src.vocab_file.empty() || src.merge_file.empty()))
        throw UserError(
            "command line error: a GPT-2 BPE tokenizer needs both --vocab-file vocab.json and --merge-file "
            "merges.txt" +
            hint);
    if (type == TokenizerType::kHuggingFace && src.tokenizer_json.empty())
        throw UserError("command line error: --tokenizer-type HuggingFaceTokenizer needs --tokenizer-model" + hint);
    HfTokenizerExport out;
    std::string source;
    std::optional<Gpt2Bpe> bpe;
    if (type == TokenizerType::kByte) {
        out.kind = "byte-level";
        out.vocab_size = kByteVocab;
        out.eos_token_id = kByteEod;
        source = "byte-level";
    } else {
        bpe = type == TokenizerType::kGpt2Bpe ? Gpt2Bpe::load(src.vocab_file, src.merge_file)
                                              : Gpt2Bpe::from_tokenizer_json(src.tokenizer_json);
        out.kind = type == TokenizerType::kGpt2Bpe ? "GPT-2 BPE" : "tokenizer.json";
        out.vocab_size = bpe->vocab_size();
        out.eos_token_id = bpe->end_of_document();
        source = type == TokenizerType::kGpt2Bpe ? src.vocab_file + " / " + src.merge_file : src.tokenizer_json;
    }
    if (out.vocab_size > model_vocab_size)
        throw UserError(fmt::format(
            "config error: the tokenizer {} has ids up to {}, but the model's vocabulary is {}\n---> HINT: pass "
            "the tokenizer the model's data was preprocessed with",
            source, out.vocab_size - 1, model_vocab_size));
    const std::string eos_text = !out.eos_token_id ? std::string()
                                 : bpe             ? bpe->decode({*out.eos_token_id})
                                                   : std::string(kEndOfText);

    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec)
        throw UserError(fmt::format("cannot create the output directory '{}': {}", out_dir, ec.message()),
                        kExitCheckpoint);
    auto write = [&](const std::string& name, const std::string& bytes) {
        write_file_atomic((fs::path(out_dir) / name).string(), bytes);
        out.files.push_back(name);
    };
    json config = {{"model_max_length", model_max_length}, {"clean_up_tokenization_spaces", false}};
    if (type == TokenizerType::kByte) {
        write("tokenizer.json", byte_tokenizer_json().dump(2) + "\n");
        config["tokenizer_class"] = "PreTrainedTokenizerFast";
        for (const char* key : {"bos_token", "eos_token"}) config[key] = eos_text;
    } else if (type == TokenizerType::kGpt2Bpe) {
        const std::string vocab = read_bytes(src.vocab_file), merges = read_bytes(src.merge_file);
        write("vocab.json", vocab);
        write("merges.txt", merges);
        write("tokenizer.json",
              bpe_tokenizer_json(json::parse(vocab), merges_list(merges), byte_level(true), out.eos_token_id, eos_text)
                      .dump(2) +
                  "\n");
        config["tokenizer_class"] = "GPT2Tokenizer";
        config["add_prefix_space"] = false;
        config["add_bos_token"] = false;
        config["errors"] = "replace";
        if (out.eos_token_id)
            for (const char* key : {"bos_token", "eos_token", "unk_token"}) config[key] = eos_text;
    } else {
        write("tokenizer.json", read_bytes(src.tokenizer_json));
        const fs::path beside = fs::path(src.tokenizer_json).parent_path();
        if (fs::is_regular_file(beside / "special_tokens_map.json"))
            write("special_tokens_map.json", read_bytes((beside / "special_tokens_map.json").string()));
        if (fs::is_regular_file(beside / "tokenizer_config.json")) {
            write("tokenizer_config.json", read_bytes((beside / "tokenizer_config.json").string()));
            return out;
        }
        config["tokenizer_class"] = "PreTrainedTokenizerFast";
        if (out.eos_token_id) config["eos_token"] = eos_text;
    }
    write("tokenizer_config.json", config.dump(2) + "\n");
    return out;
}

}  // namespace ms
