// tokenizer_json.cpp: Gpt2Bpe::from_tokenizer_json -- a Hugging Face tokenizer.json holding a byte-level BPE
// (GPT-2's or Llama-3's pre-tokenizer, gpt2_bpe.h), read with its vocabulary, merges, ignore_merges and added
// tokens; anything the encoder would not reproduce is refused with a sentence naming the field.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/check.h"
#include "engine/data/gpt2_bpe.h"

namespace ms {
namespace {

using nlohmann::json;

// The pre-tokenizer patterns as tokenizer.json spells them.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

[[noreturn]] void refuse(const std::string& path, const std::string& what) {
    throw UserError(
        fmt::format("tokenizer error: {} {}, which this byte-level BPE encoder does not reproduce\n---> HINT: "
                    "preprocess reads GPT-2- and Llama-3-style tokenizer.json files (model BPE, no normalizer, "
                    "ByteLevel pre-tokenizer or Split on their pattern + ByteLevel); for a GPT-2 vocabulary "
                    "pass --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json --merge-file merges.txt",
                    path, what));
}

json read_json(const std::string& path, const std::string& hint) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw UserError(fmt::format("tokenizer error: cannot open '{}'\n---> HINT: {}", path, hint));
    std::stringstream ss;
    ss << f.rdbuf();
    json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
        throw UserError(fmt::format("tokenizer error: '{}' is not a JSON object\n---> HINT: {}", path, hint));
    return j;
}

bool is_byte_level(const json& p, bool use_regex) {
    return p.is_object() && p.value("type", "") == "ByteLevel" && p.value("use_regex", true) == use_regex;
}

// The pre-tokenizer: ByteLevel with its own (GPT-2) regex, or Sequence[Split(pattern, Isolated), ByteLevel
// without regex].
Gpt2Bpe::PreTokenizer pre_tokenizer_of(const json& p, const std::string& path) {
    const json* byte_level = &p;
    std::string_view pattern = kGpt2Pattern;
    std::string split_pattern;
    if (p.is_object() && p.value("type", "") == "Sequence" && p.contains("pretokenizers") &&
        p["pretokenizers"].is_array() && p["pretokenizers"].size() == 2) {
        const json& split = p["pretokenizers"][0];
        byte_level = &p["pretokenizers"][1];
        if (split.value("type", "") != "Split" || !split.contains("pattern") || !split["pattern"].is_object() ||
            !split["pattern"].contains("Regex") || split.value("behavior", "") != "Isolated" ||
            split.value("invert", false) || !is_byte_level(*byte_level, false))
            refuse(path, "has a pre_tokenizer sequence other than Split(Regex, Isolated) + ByteLevel");
        split_pattern = split["pattern"]["Regex"].get<std::string>();
        pattern = split_pattern;
    } else if (!is_byte_level(p, true)) {
        refuse(path, fmt::format("has the pre_tokenizer {}", p.dump()));
    }
    if (byte_level->value("add_prefix_space", false))
        refuse(path, "has a ByteLevel pre_tokenizer with add_prefix_space");
    if (pattern == kGpt2Pattern) return Gpt2Bpe::PreTokenizer::kGpt2;
    if (pattern == kLlama3Pattern) return Gpt2Bpe::PreTokenizer::kLlama3;
    refuse(path, fmt::format("splits on the pattern {}, neither GPT-2's nor Llama-3's", json(pattern).dump()));
}

}  // namespace

Gpt2Bpe Gpt2Bpe::from_tokenizer_json(const std::string& path) {
    const std::string hint = "pass the tokenizer.json of a Hugging Face tokenizer (tokenizer.save(...))";
    const json j = read_json(path, hint);
    if (!j.contains("model") || !j["model"].is_object()) refuse(path, "has no \"model\" object");
    const json& model = j["model"];
    if (model.value("type", "BPE") != "BPE") refuse(path, fmt::format("has a {} model", model.value("type", "")));
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"})
        if (model.contains(key) && !model[key].is_null() && model[key] != "")
            refuse(path, fmt::format("sets model.{} to {}", key, model[key].dump()));
    if (j.contains("normalizer") && !j["normalizer"].is_null())
        refuse(path, fmt::format("has the normalizer {}", j["normalizer"].dump()));
    if (!model.contains("vocab") || !model.contains("merges") || !model["merges"].is_array())
        refuse(path, "has no model.vocab object or model.merges list");

    // The merges as merges.txt lines ("left right"): tokenizer.json writes them as strings or as pairs.
    std::string merges;
    for (const json& m : model["merges"]) {
        if (m.is_string()) {
            merges += m.get<std::string>();
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
            merges += m[0].get<std::string>() + " " + m[1].get<std::string>();
        } else {
            refuse(path, fmt::format("has the merge {}, neither \"left right\" nor [\"left\", \"right\"]", m.dump()));
        }
        merges += '\n';
    }
    Gpt2Bpe t = from_strings(model["vocab"].dump(), merges, path);
    t.pre_tokenizer_ = pre_tokenizer_of(j.value("pre_tokenizer", json()), path);
    t.ignore_merges_ = model.value("ignore_merges", false);

    std::vector<std::string> specials;
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
        for (const json& a : j["added_tokens"]) {
            const auto id = a.value("id", int64_t{-1});
            const std::string content = a.value("content", "");
            if (id < 0 || id > INT32_MAX || content.empty())
                refuse(path, fmt::format("has the added token {} without a content and an id", a.dump()));
            for (const char* flag : {"single_word", "lstrip", "rstrip"})
                if (a.value(flag, false)) refuse(path, fmt::format("has the added token {} with {}", a.dump(), flag));
            t.split_tokens_.emplace_back(content, static_cast<int32_t>(id));
            t.encoder_[content] = static_cast<int32_t>(id);
            t.decoder_[static_cast<int32_t>(id)] = content;
            t.max_id_ = std::max(t.max_id_, static_cast<int32_t>(id));
            if (a.value("special", false)) specials.push_back(content);
        }
    }
    std::stable_sort(t.split_tokens_.begin(), t.split_tokens_.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    t.end_of_document_.clear();
    const std::filesystem::path config = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
    if (std::filesystem::exists(config)) {
        const json c =
            read_json(config.string(), "the tokenizer_config.json beside tokenizer.json names its eos_token");
        if (c.contains("eos_token") && c["eos_token"].is_string()) t.end_of_document_ = c["eos_token"];
        if (c.contains("eos_token") && c["eos_token"].is_object())
            t.end_of_document_ = c["eos_token"].value("content", "");
    }
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"})
        if (t.end_of_document_.empty() && std::find(specials.begin(), specials.end(), name) != specials.end())
            t.end_of_document_ = name;
    return t;
}

}  // namespace ms
