// test_preprocess.cpp: `preprocess` through the binary --
//   - the ids of GPT2BPETokenizer (vocab.json + merges.txt) and HuggingFaceTokenizer (a GPT-2- and a Llama-3-style
//     tokenizer.json) equal Hugging Face `tokenizers` on the same text, read back from .bin/.idx as Megatron's
//     indexed_dataset.py reads them (tests/e2e/hf_tokenizers_reference.py trains the tiny tokenizers; skipped
//     without the package), added tokens written in the text included for a tokenizer.json;
//   - JSON Lines with two keys give one dataset per key, --append-eod ends each document with the tokenizer's
//     EOD, and 1 or 3 workers write the same bytes;
//   - bad input (a line without the key, a line that is not JSON, an unreadable vocabulary, an unsupported
//     tokenizer.json) ends with exit code 2 and a sentence naming the file and line;
//   - Llama-3's pre-tokenizer splits as Hugging Face's on pasted examples (without the package);
//   - progress: a bar with rate and ETA on a terminal, no carriage returns otherwise.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/data/gpt2_bpe.h"
#include "engine/data/progress.h"
#include "tests/common/temp_dir.h"
#include "tests/common/terminal_run.h"
#include "tests/e2e/run_cli.h"

namespace {

using ms::test::run_cli;
using ms::test::TempDir;
using nlohmann::json;

const std::string kBpeDir = MS_SOURCE_DIR "/tests/e2e/data/tiny_bpe";
constexpr int32_t kTinyBpeEod = 266;  // "<|endoftext|>" in tiny_bpe/vocab.json

std::string read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// The documents of a Megatron dataset (one sequence per document, as preprocess writes it).
std::vector<std::vector<int32_t>> read_documents(const std::string& prefix) {
    const std::string idx = read_bytes(prefix + ".idx"), bin = read_bytes(prefix + ".bin");
    const auto at = [&](size_t offset, auto v) {
        std::memcpy(&v, idx.data() + offset, sizeof(v));
        return v;
    };
    const bool wide = at(17, uint8_t{}) == 4;
    const auto n = at(18, uint64_t{});
    std::vector<std::vector<int32_t>> docs;
    for (uint64_t s = 0; s < n; ++s) {
        const auto len = at(34 + 4 * s, int32_t{});
        const auto ptr = static_cast<size_t>(at(34 + 4 * n + 8 * s, int64_t{}));
        std::vector<int32_t> ids(static_cast<size_t>(len));
        for (size_t i = 0; i < ids.size(); ++i) {
            if (wide) {
                std::memcpy(&ids[i], bin.data() + ptr + 4 * i, 4);
            } else {
                uint16_t v;
                std::memcpy(&v, bin.data() + ptr + 2 * i, 2);
                ids[i] = v;
            }
        }
        docs.push_back(std::move(ids));
    }
    return docs;
}

// hf_tokenizers_reference.py with the first interpreter that imports `tokenizers` (exit code 77: none does).
ms::test::CliResult reference(const std::string& args) {
    ms::test::CliResult r{77, ""};
    for (const std::string& python : {std::string(MS_SYSTEM_PYTHON), std::string("python3")}) {
        if (python.empty()) continue;
        const std::string cmd = python + " " MS_SOURCE_DIR "/tests/e2e/hf_tokenizers_reference.py " + args + " 2>&1";
        FILE* p = popen(cmd.c_str(), "r");
        if (!p) continue;
        r.output.clear();
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
        const int status = pclose(p);
        r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (r.exit_code != 77) break;
    }
    return r;
}

// Texts that exercise both pre-tokenizers: contractions in both cases, digit runs, punctuation runs before
// newlines, whitespace runs, CRLF, non-ASCII letters.
const std::vector<std::string> kTexts = {
    "Hello world",
    "The quick brown fox jumps over the lazy dog. It's lazy, isn't it?",
    "don't we'll they're I've you'd she's it'S WE'LL THEY'RE",
    "  two spaces\tthen tab\n\nnewlines  \n\n\n  indented",
    "numbers 1 12 123 1234 12345 and 3.14159 or -42",
    "punctuation!!! ?? ... ;-) <|> (parens) [brackets]\n\n",
    "windows\r\nlines\r\n\r\nend   ",
    "café über naïve façade déjà vu Zürich",
    "def main():\n    return 0  # code\n\n\n    x = y + z * 2\n",
    "tokenization tokenizer tokens retokenize; the other hand",
    "x",
};

struct Corpus {
    std::string jsonl;
    std::vector<std::string> titles, texts;
};

// kTexts under "text", a title per line under "title", `copies` times over.
Corpus write_corpus(const TempDir& dir, int copies) {
    Corpus c{dir / "docs.jsonl", {}, {}};
    std::ofstream f(c.jsonl);
    for (int k = 0; k < copies; ++k) {
        for (size_t i = 0; i < kTexts.size(); ++i) {
            c.titles.push_back("Title " + std::to_string(k) + ": " + kTexts[(i + 3) % kTexts.size()].substr(0, 12));
            c.texts.push_back(kTexts[i]);
            f << json{{"title", c.titles.back()}, {"text", c.texts.back()}, {"id", i}}.dump() << "\n";
        }
    }
    return c;
}

TEST(Preprocess, IdsEqualHuggingFaceTokenizers) {
    const TempDir dir("ms_preprocess_hf");
    const auto made = reference("make " + dir.path());
    if (made.exit_code == 77)
        GTEST_SKIP() << "the Hugging Face `tokenizers` package is not importable: " << made.output;
    ASSERT_EQ(made.exit_code, 0) << made.output;
    const Corpus corpus = write_corpus(dir, 1);
    std::ofstream(dir / "text.json") << json(corpus.texts).dump();
    std::ofstream(dir / "title.json") << json(corpus.titles).dump();
    const struct {
        std::string name, tokenizer_json, flags;
        std::string eod;  // the end-of-document token Hugging Face looks up, or none
        uint8_t dtype_code;
    } cases[] = {
        {"gpt2_files", "gpt2/tokenizer.json",
         "--tokenizer-type GPT2BPETokenizer --vocab-file " + dir / "gpt2/vocab.json" + " --merge-file " +
             dir / "gpt2/merges.txt" + " --append-eod",
         "<|endoftext|>", 8},
        {"gpt2_json", "gpt2/tokenizer.json",
         "--tokenizer-type HuggingFaceTokenizer --tokenizer-model " + dir / "gpt2/tokenizer.json" + " --append-eod",
         "<|endoftext|>", 8},
        {"llama3", "llama3/tokenizer.json",
         "--tokenizer-type HuggingFaceTokenizer --tokenizer-model " + dir / "llama3/tokenizer.json" +
             " --append-eod --workers 3",
         "<|end_of_text|>", 4},
        {"llama3_no_eod", "llama3/tokenizer.json",
         "--tokenizer-type HuggingFaceTokenizer --tokenizer-model " + dir / "llama3/tokenizer.json", "none", 4},
    };
    // Added tokens written in the text: a tokenizer.json splits them out, as Hugging Face does.
    const std::vector<std::string> special = {"a<|endoftext|>b", "x <|end_of_text|> y<|begin_of_text|>",
                                              "<|endoftext|><|endoftext|> <|end_of_text|>\n", "<|endoftext"};
    std::ofstream(dir / "special.json") << json(special).dump();
    std::ofstream special_jsonl(dir / "special.jsonl");
    for (const std::string& text : special) special_jsonl << json{{"special", text}}.dump() << "\n";
    special_jsonl.close();
    for (const auto& c : cases) {
        const std::string prefix = dir / c.name;
        if (c.flags.find("--tokenizer-model") != std::string::npos) {
            const auto r = run_cli("preprocess --input " + dir / "special.jsonl" +
                                   " --json-keys special --output-prefix " + prefix + " " + c.flags);
            ASSERT_EQ(r.exit_code, 0) << c.name << ": " << r.output;
            const auto check = reference("check " + dir / c.tokenizer_json + " " + prefix + "_special_document " +
                                         dir / "special.json '" + c.eod + "'");
            EXPECT_EQ(check.exit_code, 0) << c.name << ": " << check.output;
        }
        const auto r = run_cli("preprocess --input " + corpus.jsonl + " --json-keys text title --output-prefix " +
                               prefix + " " + c.flags);
        ASSERT_EQ(r.exit_code, 0) << c.name << ": " << r.output;
        for (const std::string key : {"text", "title"}) {
            const std::string dataset = prefix + "_" + key + "_document";
            EXPECT_EQ(static_cast<uint8_t>(read_bytes(dataset + ".idx")[17]), c.dtype_code) << dataset;
            const auto check = reference("check " + dir / c.tokenizer_json + " " + dataset + " " +
                                         dir / (key + ".json") + " '" + c.eod + "'");
            EXPECT_EQ(check.exit_code, 0) << c.name << ": " << check.output;
        }
    }
}

// Llama-3's pre-tokenizer, against Hugging Face's Split(Regex(pattern), "isolated") on the same strings (its
// pre_tokenize_str output, pasted): digits in threes, case-insensitive contractions, a non-letter before letters,
// punctuation runs taking their newlines, whitespace runs up to their last newline, NBSP as whitespace.
TEST(Preprocess, Llama3PreTokenizerSplitsAsHuggingFace) {
    using Pieces = std::vector<std::string>;
    EXPECT_EQ(
        ms::Gpt2Bpe::pretokenize_llama3("numbers 12345 and 3.14 don't WE'LL it'S"),
        (Pieces{"numbers", " ", "123", "45", " and", " ", "3", ".", "14", " don", "'t", " WE", "'LL", " it", "'S"}));
    EXPECT_EQ(ms::Gpt2Bpe::pretokenize_llama3("punct!!!\n\n  x\t(y) \"quoted\"\r\n\r\nend  "),
              (Pieces{"punct", "!!!\n\n", " ", " x", "\t", "(y", ")", " \"", "quoted", "\"\r\n\r\n", "end", "  "}));
    EXPECT_EQ(ms::Gpt2Bpe::pretokenize_llama3("caf\xC3\xA9 \xC3\xBC"
                                              "ber\xC2\xA0na\xC3\xAFve  \n  "),
              (Pieces{"caf\xC3\xA9",
                      " \xC3\xBC"
                      "ber",
                      "\xC2\xA0na\xC3\xAFve", "  \n", "  "}));
}

TEST(Preprocess, JsonLinesKeysEodAndWorkers) {
    const TempDir dir("ms_preprocess_jsonl");
    const Corpus corpus = write_corpus(dir, 400);  // 4400 documents: more than one batch of 4096
    const std::string base = "preprocess --input " + corpus.jsonl + " --json-keys text title --tokenizer-type " +
                             "GPT2BPETokenizer --vocab-file " + kBpeDir + "/vocab.json --merge-file " + kBpeDir +
                             "/merges.txt --append-eod --output-prefix ";
    const auto one = run_cli(base + dir / "w1 --workers 1");
    ASSERT_EQ(one.exit_code, 0) << one.output;
    const auto three = run_cli(base + dir / "w3 --workers 3");
    ASSERT_EQ(three.exit_code, 0) << three.output;
    EXPECT_NE(one.output.find("preprocess: 4400 documents"), std::string::npos) << one.output;
    EXPECT_EQ(one.output.find('\r'), std::string::npos) << "a pipe gets plain lines, not a redrawn bar";

    const ms::Gpt2Bpe bpe = ms::Gpt2Bpe::load(kBpeDir + "/vocab.json", kBpeDir + "/merges.txt");
    for (const auto& [key, texts] : {std::pair{std::string("text"), corpus.texts}, {"title", corpus.titles}}) {
        for (const std::string ext : {".bin", ".idx"})
            EXPECT_EQ(read_bytes(dir / ("w1_" + key + "_document" + ext)),
                      read_bytes(dir / ("w3_" + key + "_document" + ext)))
                << key << ext << " differs between 1 and 3 workers";
        const auto docs = read_documents(dir / ("w1_" + key + "_document"));
        ASSERT_EQ(docs.size(), texts.size()) << key;
        for (size_t i = 0; i < docs.size(); ++i) {
            std::vector<int32_t> expected = bpe.encode(texts[i]);
            expected.push_back(kTinyBpeEod);
            ASSERT_EQ(docs[i], expected) << key << " document " << i;
        }
    }
    // A plain text file: documents separated by blank lines; without --append-eod no EOD.
    std::ofstream(dir / "plain.txt") << "first line\nsecond line\n\n\nnext document\n";
    const auto plain =
        run_cli("preprocess --input " + dir / "plain.txt" + " --tokenizer-type GPT2BPETokenizer " + "--vocab-file " +
                kBpeDir + "/vocab.json --merge-file " + kBpeDir + "/merges.txt --output-prefix " + dir / "plain");
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    EXPECT_EQ(read_documents(dir / "plain_text_document"),
              (std::vector<std::vector<int32_t>>{bpe.encode("first line\nsecond line"), bpe.encode("next document")}));
}

TEST(Preprocess, EmptyDocumentsAreSkippedAndCounted) {
    const TempDir dir("ms_preprocess_empty");
    std::ofstream(dir / "in.jsonl") << R"({"text": "a b"})"
                                    << "\n\n"
                                    << R"({"text": ""})"
                                    << "\n"
                                    << R"({"text": ["c ", "d"]})"
                                    << "\n";
    const auto r = run_cli("preprocess --input " + dir / "in.jsonl" + " --json-keys text --output-prefix " + dir / "o");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("2 documents, 8 tokens"), std::string::npos) << r.output;  // byte ids + EOD 256 each
    EXPECT_NE(r.output.find("1 empty documents skipped"), std::string::npos) << r.output;
    EXPECT_EQ(read_documents(dir / "o_text_document"),
              (std::vector<std::vector<int32_t>>{{'a', ' ', 'b', 256}, {'c', ' ', 'd', 256}}));
}

TEST(Preprocess, BadInputIsASentence) {
    const TempDir dir("ms_preprocess_bad");
    const auto expect_error = [&](const std::string& args, const std::vector<std::string>& parts) {
        const auto r = run_cli("preprocess --output-prefix " + dir / "o " + args);
        EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
        for (const std::string& p : parts) EXPECT_NE(r.output.find(p), std::string::npos) << p << "\n" << r.output;
    };
    const std::string jsonl = dir / "in.jsonl";
    std::ofstream(jsonl) << R"({"text": "a", "title": "t"})"
                         << "\n"
                         << R"({"text": "b"})"
                         << "\n";
    expect_error("--input " + jsonl + " --json-keys text title",
                 {"line 2 of '" + jsonl + "' has no key 'title' (its keys: text)", "--json-keys"});
    std::ofstream(dir / "broken.jsonl") << R"({"text": "a"})"
                                        << "\n"
                                        << R"({"text": "b)"
                                        << "\n";
    expect_error("--input " + dir / "broken.jsonl" + " --json-keys text",
                 {"line 2 of '" + dir / "broken.jsonl" + "' is not valid JSON", "one JSON object per line"});
    std::ofstream(dir / "array.jsonl") << "[1, 2]\n";
    expect_error("--input " + dir / "array.jsonl" + " --json-keys text", {"line 1", "is a JSON array, not an object"});
    std::ofstream(dir / "number.jsonl") << R"({"text": 7})"
                                        << "\n";
    expect_error("--input " + dir / "number.jsonl" + " --json-keys text",
                 {"the value of 'text' is a JSON number, not a string or a list of strings"});

    expect_error("--input " + jsonl + " --tokenizer-type GPT2BPETokenizer --vocab-file " + dir / "missing.json" +
                     " --merge-file " + kBpeDir + "/merges.txt",
                 {"cannot open the GPT-2 vocabulary (vocab.json) '" + dir / "missing.json" + "'"});
    expect_error("--input " + jsonl + " --tokenizer-type GPT2BPETokenizer --vocab-file " + kBpeDir + "/vocab.json",
                 {"needs --vocab-file (vocab.json) and --merge-file (merges.txt)"});
    expect_error("--input " + jsonl + " --tokenizer-type SentencePiece", {"is not one of byte, GPT2BPETokenizer"});
    std::ofstream(dir / "wordpiece.json") << R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})";
    expect_error(
        "--input " + jsonl + " --tokenizer-type HuggingFaceTokenizer --tokenizer-model " + dir / "wordpiece.json",
        {dir / "wordpiece.json" + " has a WordPiece model", "GPT-2- and Llama-3-style"});
    std::ofstream(dir / "no_eod.json") << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}})";
    expect_error("--input " + jsonl + " --tokenizer-type HuggingFaceTokenizer --tokenizer-model " +
                     dir / "no_eod.json" + " --append-eod",
                 {"--append-eod: the HuggingFaceTokenizer tokenizer has no end-of-document token"});
    std::ofstream(dir / "prefix_space.json") << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": true, "use_regex": true}})";
    expect_error(
        "--input " + jsonl + " --tokenizer-type HuggingFaceTokenizer --tokenizer-model " + dir / "prefix_space.json",
        {"add_prefix_space"});
}

TEST(Preprocess, ProgressBarOnATerminal) {
    EXPECT_EQ(ms::Progress::line("preprocess", ms::Progress::Style::kBar, 512 << 10, 1 << 20, 10, 2.0),
              "preprocess [###############...............]  50.0%  512.0 KiB / 1.0 MiB  256.0 KiB/s  10 documents  "
              "ETA 0:02");
    EXPECT_EQ(ms::Progress::line("preprocess", ms::Progress::Style::kLines, 512 << 10, 1 << 20, 10, 2.0),
              "preprocess:  50.0%  512.0 KiB / 1.0 MiB  256.0 KiB/s  10 documents  ETA 0:02");
    // Through the binary on a pseudo-terminal (util-linux `script`), when there is one.
    if (!ms::test::have_pseudo_terminal()) GTEST_SKIP() << "no `script` for a pseudo-terminal";
    const TempDir dir("ms_preprocess_tty");
    std::ofstream(dir / "in.txt") << "one\n\ntwo\n";
    const auto r = ms::test::run_on_terminal("'" MS_BINARY_PATH "' preprocess --input " + dir / "in.txt" +
                                             " --output-prefix " + dir / "o");
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("preprocess [##############################] 100.0%"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("2 documents  ETA 0:00"), std::string::npos) << r.output;
}

}  // namespace
