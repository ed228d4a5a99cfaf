// gpt2_bpe.cpp: GPT-2's byte-level BPE (gpt2_bpe.h): bytes_to_unicode, the pre-tokenizer as a hand-written scanner
// of the regex's alternatives, merges by rank, and decoding.
#include "engine/data/gpt2_bpe.h"

#include <algorithm>
#include <array>
#include <climits>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/check.h"

namespace ms {
namespace {

std::string utf8(uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
        s += static_cast<char>(cp);
    } else if (cp < 0x800) {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        s += static_cast<char>(0xE0 | (cp >> 12));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        s += static_cast<char>(0xF0 | (cp >> 18));
        s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
}

// The code point at text[i] and its length in bytes; an invalid or truncated sequence is one byte, returned as
// kInvalid (classified as a letter, gpt2_bpe.h).
constexpr uint32_t kInvalid = 0xFFFFFFFF;
std::pair<uint32_t, size_t> next_code_point(std::string_view text, size_t i) {
    const auto b = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
    const uint8_t c = b(i);
    if (c < 0x80) return {c, 1};
    size_t len = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
        len = 2;
        cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3;
        cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4;
        cp = c & 0x07;
    } else {
        return {kInvalid, 1};
    }
    if (i + len > text.size()) return {kInvalid, 1};
    for (size_t k = 1; k < len; ++k) {
        if ((b(i + k) & 0xC0) != 0x80) return {kInvalid, 1};
        cp = (cp << 6) | (b(i + k) & 0x3F);
    }
    return {cp, len};
}

enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

CharClass classify(uint32_t cp) {
    if (cp < 0x80) {
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::kLetter;
        if (cp >= '0' && cp <= '9') return CharClass::kNumber;
        if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return CharClass::kSpace;
        return CharClass::kOther;
    }
    const bool space = cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
                       cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
    return space ? CharClass::kSpace : CharClass::kLetter;  // the non-ASCII approximation of gpt2_bpe.h
}

// bytes_to_unicode(): byte -> its printable code point's UTF-8, and code point -> byte.
struct ByteAlphabet {
    std::array<std::string, 256> symbol;
    std::unordered_map<uint32_t, uint8_t> byte_of;
    ByteAlphabet() {
        int extra = 0;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + extra++);
            symbol[static_cast<size_t>(b)] = utf8(cp);
            byte_of[cp] = static_cast<uint8_t>(b);
        }
    }
};

const ByteAlphabet& byte_alphabet() {
    static const ByteAlphabet alphabet;  // immutable after construction (thread-safe static init)
    return alphabet;
}

std::string read_text_file(const std::string& path, const char* what) {
    std::ifstream f(path, std::ios::binary);
    if (!f)
        throw UserError(
            fmt::format("tokenizer error: cannot open the GPT-2 {} '{}'\n---> HINT: pass the vocab.json "
                        "and merges.txt of the model (Hugging Face ships both with every GPT-2 model)",
                        what, path));
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

}  // namespace

Gpt2Bpe Gpt2Bpe::load(const std::string& vocab_json_path, const std::string& merges_path) {
    return from_strings(read_text_file(vocab_json_path, "vocabulary (vocab.json)"),
                        read_text_file(merges_path, "merges (merges.txt)"), vocab_json_path + " / " + merges_path);
}

Gpt2Bpe Gpt2Bpe::from_strings(std::string_view vocab_json, std::string_view merges, const std::string& label) {
    Gpt2Bpe t;
    const nlohmann::json vocab = nlohmann::json::parse(vocab_json, nullptr, /*allow_exceptions=*/false);
    if (vocab.is_discarded() || !vocab.is_object() || vocab.empty())
        throw UserError(
            fmt::format("tokenizer error: the vocabulary of {} is not a non-empty JSON object "
                        "{{\"token\": id, ...}}",
                        label));
    for (const auto& [token, id] : vocab.items()) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
            throw UserError(
                fmt::format("tokenizer error: the vocabulary of {} maps '{}' to {}, not a non-negative "
                            "32-bit integer id",
                            label, token, id.dump()));
        const auto v = static_cast<int32_t>(id.get<int64_t>());
        if (!t.decoder_.emplace(v, token).second)
            throw UserError(fmt::format("tokenizer error: the vocabulary of {} gives id {} to both '{}' and '{}'",
                                        label, v, t.decoder_[v], token));
        t.encoder_[token] = v;
        t.max_id_ = std::max(t.max_id_, v);
    }
    size_t line_no = 0, pos = 0;
    while (pos < merges.size()) {
        size_t end = merges.find('\n', pos);
        if (end == std::string_view::npos) end = merges.size();
        std::string_view line = merges.substr(pos, end - pos);
        pos = end + 1;
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
        const size_t sp = line.find(' ');
        if (sp == 0 || sp == std::string_view::npos || sp + 1 == line.size() ||
            line.find(' ', sp + 1) != std::string_view::npos)
            throw UserError(
                fmt::format("tokenizer error: line {} of the merges of {} is '{}', not two symbols "
                            "separated by one space",
                            line_no, label, line));
        t.ranks_.emplace(std::string(line), static_cast<int>(t.ranks_.size()));  // a repeated pair keeps its first rank
    }
    return t;
}

namespace {

struct Cp {
    size_t begin;
    uint32_t cp;
    CharClass cls;
};

std::vector<Cp> code_points(std::string_view text) {
    std::vector<Cp> cps;
    for (size_t i = 0; i < text.size();) {
        const auto [cp, len] = next_code_point(text, i);
        cps.push_back({i, cp, cp == kInvalid ? CharClass::kLetter : classify(cp)});
        i += len;
    }
    return cps;
}

// The pieces of `text` cut where match(i) (the end of the regex's match at code point i) says.
template <typename Match>
std::vector<std::string> cut(std::string_view text, const std::vector<Cp>& cps, const Match& match) {
    const size_t n = cps.size();
    std::vector<std::string> pieces;
    for (size_t i = 0; i < n;) {
        const size_t j = match(i);
        const size_t end = j < n ? cps[j].begin : text.size();
        pieces.emplace_back(text.substr(cps[i].begin, end - cps[i].begin));
        i = j;
    }
    return pieces;
}

}  // namespace

std::vector<std::string> Gpt2Bpe::pretokenize(std::string_view text) {
    const std::vector<Cp> cps = code_points(text);
    const size_t n = cps.size();
    const auto is = [&](size_t k, CharClass c) { return k < n && cps[k].cls == c; };
    const auto cp_at = [&](size_t k) { return k < n ? cps[k].cp : 0u; };
    const auto run = [&](size_t k, CharClass c) {
        while (k < n && cps[k].cls == c) ++k;
        return k;
    };
    // The end of the match at code point i: the regex's alternatives, in order.
    const auto match = [&](size_t i) -> size_t {
        if (cp_at(i) == '\'') {  // 's|'t|'re|'ve|'m|'ll|'d
            const uint32_t a = cp_at(i + 1), b = cp_at(i + 2);
            if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
        }
        for (const CharClass c : {CharClass::kLetter, CharClass::kNumber, CharClass::kOther}) {  // ` ?X+`
            if (cp_at(i) == ' ' && is(i + 1, c)) return run(i + 1, c);
            if (is(i, c)) return run(i, c);
        }
        const size_t j = run(i, CharClass::kSpace);  // \s+(?!\S) backs off one before a non-space; else \s+
        return j < n && j - 1 > i ? j - 1 : j;
    };
    return cut(text, cps, match);
}

std::vector<std::string> Gpt2Bpe::pretokenize_llama3(std::string_view text) {
    const std::vector<Cp> cps = code_points(text);
    const size_t n = cps.size();
    const auto is = [&](size_t k, CharClass c) { return k < n && cps[k].cls == c; };
    const auto cp_at = [&](size_t k) { return k < n ? cps[k].cp : 0u; };
    const auto lower = [&](size_t k) { return cp_at(k) >= 'A' && cp_at(k) <= 'Z' ? cp_at(k) + 32 : cp_at(k); };
    const auto newline = [&](size_t k) { return cp_at(k) == '\r' || cp_at(k) == '\n'; };
    const auto run = [&](size_t k, CharClass c) {
        while (k < n && cps[k].cls == c) ++k;
        return k;
    };
    // The end of the match at code point i: the regex's alternatives, in order.
    const auto match = [&](size_t i) -> size_t {
        if (cp_at(i) == '\'') {  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
            const uint32_t a = lower(i + 1), b = lower(i + 2);
            if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
        }
        if (is(i, CharClass::kLetter)) return run(i, CharClass::kLetter);  // [^\r\n\p{L}\p{N}]?\p{L}+
        if (i < n && !is(i, CharClass::kNumber) && !newline(i) && is(i + 1, CharClass::kLetter))
            return run(i + 1, CharClass::kLetter);
        if (is(i, CharClass::kNumber)) {  // \p{N}{1,3}
            size_t j = i;
            while (j < i + 3 && is(j, CharClass::kNumber)) ++j;
            return j;
        }
        const size_t other = cp_at(i) == ' ' && is(i + 1, CharClass::kOther) ? i + 1 : i;
        if (is(other, CharClass::kOther)) {  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
            size_t j = run(other, CharClass::kOther);
            while (newline(j)) ++j;
            return j;
        }
        const size_t j = run(i, CharClass::kSpace);
        for (size_t k = j; k > i; --k)  // \s*[\r\n]+: up to the run's last newline
            if (newline(k - 1)) return k;
        return j < n && j - 1 > i ? j - 1 : j;  // \s+(?!\S) backs off one before a non-space; else \s+
    };
    return cut(text, cps, match);
}

std::vector<std::string> Gpt2Bpe::bpe(std::string_view piece) const {
    const ByteAlphabet& alphabet = byte_alphabet();
    std::vector<std::string> word;
    for (const char c : piece) word.push_back(alphabet.symbol[static_cast<uint8_t>(c)]);
    while (word.size() > 1) {
        int best = INT_MAX;
        size_t at = 0;
        for (size_t k = 0; k + 1 < word.size(); ++k) {
            const auto it = ranks_.find(word[k] + " " + word[k + 1]);
            if (it != ranks_.end() && it->second < best) {
                best = it->second;
                at = k;
            }
        }
        if (best == INT_MAX) break;
        const std::string left = word[at], right = word[at + 1];
        std::vector<std::string> merged;  // every occurrence of the pair, left to right, not overlapping
        for (size_t k = 0; k < word.size();) {
            if (k + 1 < word.size() && word[k] == left && word[k + 1] == right) {
                merged.push_back(left + right);
                k += 2;
            } else {
                merged.push_back(word[k++]);
            }
        }
        word = std::move(merged);
    }
    return word;
}

void Gpt2Bpe::encode_piece(const std::string& piece, std::vector<int32_t>& ids) const {
    if (ignore_merges_) {
        const ByteAlphabet& alphabet = byte_alphabet();
        std::string word;
        for (const char c : piece) word += alphabet.symbol[static_cast<uint8_t>(c)];
        if (const auto it = encoder_.find(word); it != encoder_.end()) {
            ids.push_back(it->second);
            return;
        }
    }
    for (const std::string& symbol : bpe(piece)) {
        const auto it = encoder_.find(symbol);
        if (it == encoder_.end())
            throw UserError(
                fmt::format("tokenizer error: the vocabulary has no entry for the BPE symbol '{}' "
                            "(from '{}'); a GPT-2 vocabulary holds all 256 byte symbols and every "
                            "merge result\n---> HINT: check that vocab.json and merges.txt belong "
                            "to the same tokenizer",
                            symbol, piece));
        ids.push_back(it->second);
    }
}

void Gpt2Bpe::encode_text(std::string_view text, PieceCache* cache, std::vector<int32_t>& ids) const {
    constexpr size_t kMaxCachedPieces = size_t{1} << 18;  // bounds the memory a thread's cache holds
    for (const std::string& piece :
         pre_tokenizer_ == PreTokenizer::kLlama3 ? pretokenize_llama3(text) : pretokenize(text)) {
        if (cache == nullptr) {
            encode_piece(piece, ids);
            continue;
        }
        auto it = cache->find(piece);
        if (it == cache->end()) {
            if (cache->size() >= kMaxCachedPieces) cache->clear();
            std::vector<int32_t> piece_ids;
            encode_piece(piece, piece_ids);
            it = cache->emplace(piece, std::move(piece_ids)).first;
        }
        ids.insert(ids.end(), it->second.begin(), it->second.end());
    }
}

std::vector<int32_t> Gpt2Bpe::encode_split(std::string_view text, PieceCache* cache) const {
    std::vector<int32_t> ids;
    std::array<bool, 256> starts{};  // the first bytes of the added tokens
    for (const auto& t : split_tokens_) starts[static_cast<uint8_t>(t.first[0])] = true;
    size_t begin = 0;  // of the text not yet encoded
    for (size_t pos = 0; pos < text.size();) {
        if (!starts[static_cast<uint8_t>(text[pos])]) {
            ++pos;
            continue;
        }
        const auto token = std::find_if(split_tokens_.begin(), split_tokens_.end(),
                                        [&](const auto& t) { return text.substr(pos).starts_with(t.first); });
        if (token == split_tokens_.end()) {
            ++pos;
            continue;
        }
        encode_text(text.substr(begin, pos - begin), cache, ids);
        ids.push_back(token->second);
        pos += token->first.size();
        begin = pos;
    }
    encode_text(text.substr(begin), cache, ids);
    return ids;
}

std::vector<int32_t> Gpt2Bpe::encode(std::string_view text) const { return encode_split(text, nullptr); }

std::vector<int32_t> Gpt2Bpe::encode(std::string_view text, PieceCache& cache) const {
    return encode_split(text, &cache);
}

std::string Gpt2Bpe::decode(const std::vector<int32_t>& ids) const {
    const ByteAlphabet& alphabet = byte_alphabet();
    std::string out;
    for (const int32_t id : ids) {
        const auto it = decoder_.find(id);
        if (it == decoder_.end()) {
            out += "\xEF\xBF\xBD";  // U+FFFD
            continue;
        }
        const std::string& symbol = it->second;
        for (size_t i = 0; i < symbol.size();) {
            const auto [cp, len] = next_code_point(symbol, i);
            const auto byte = alphabet.byte_of.find(cp);
            if (byte != alphabet.byte_of.end()) {
                out += static_cast<char>(byte->second);
            } else {
                out.append(symbol, i, len);  // not a byte symbol (a special token such as "<|endoftext|>"): as is
            }
            i += len;
        }
    }
    return out;
}

std::optional<int32_t> Gpt2Bpe::end_of_document() const {
    const auto it = encoder_.find(end_of_document_);
    return it == encoder_.end() ? std::nullopt : std::optional<int32_t>(it->second);
}

}  // namespace ms
