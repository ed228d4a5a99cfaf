// webdataset_source.cpp: image-caption samples from WebDataset tar shards (image_text.h).
//
// Grouping (webdataset's rule): a member "dir/000123.a.b" belongs to sample key "dir/000123" (the path up to the
// first '.' of the file name, directory kept) with extension "a.b", compared in lower case. Fields: the image is
// the first of .jpg, .png, .jpeg the sample has (open_clip's "jpg;png;jpeg" order), the caption is .txt, the
// optional label .cls (a decimal class index). Other members (.json, ...) and names without an extension or
// starting with '.' are ignored. Samples are numbered shard by shard, within a shard in the order their first
// member appears.
//
// Open reads every shard's headers (tar_index.h) and keeps, per sample, the offsets and sizes of its members;
// read() opens the shard and preads them, so open costs one header read per member and memory is per-sample
// constant. Problems found at open (a member missing or given twice, a damaged shard) and at read (corrupt image,
// empty caption, image smaller than min_side) throw UserError naming the shard and the sample, or with
// skip_bad_samples drop the sample and count it.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <unordered_map>
#include <utility>

#include "engine/core/check.h"
#include "engine/core/philox.h"
#include "engine/data/image_ops.h"
#include "engine/data/image_text.h"
#include "engine/data/tar_index.h"

namespace ms {
namespace {

constexpr const char* kWhat = "WebDataset shard";
constexpr const char* kOpenHint = "check the shard paths (a list of .tar files)";
constexpr const char* kSkipHint =
    "fix or remove the sample, or set clip.skip_bad_samples: true to skip bad samples (counted)";
constexpr const char* kImageExts[3] = {"jpg", "png", "jpeg"};  // preference order

struct MemberRef {
    int64_t offset = -1;  // -1: the sample has no such member
    int64_t size = 0;
};

struct SampleRef {
    int32_t shard = 0;
    std::string key;  // "dir/000123"
    MemberRef image, caption, label;
    int8_t image_ext = -1;  // index into kImageExts
};

std::string trim(std::string_view s) {
    const char* ws = " \t\r\n\v\f";
    const size_t b = s.find_first_not_of(ws);
    if (b == std::string_view::npos) return {};
    return std::string(s.substr(b, s.find_last_not_of(ws) - b + 1));
}

// well-formed UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF
bool valid_utf8(const std::string& s) {
    for (size_t i = 0; i < s.size();) {
        const auto c = static_cast<uint8_t>(s[i]);
        if (c < 0x80) {
            ++i;
            continue;
        }
        const int n = (c >= 0xC2 && c <= 0xDF) ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c >= 0xF0 && c <= 0xF4) ? 3 : 0;
        if (n == 0 || i + n >= s.size()) return false;
        uint32_t cp = c & (0x7F >> (n + 1));
        for (int k = 1; k <= n; ++k) {
            const auto b = static_cast<uint8_t>(s[i + k]);
            if ((b & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (b & 0x3F);
        }
        if (n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return false;
        if (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)) return false;
        i += static_cast<size_t>(n) + 1;
    }
    return true;
}

std::string base_name(const std::string& path) { return std::filesystem::path(path).filename().string(); }

// webdataset's rule: "dir/000123.A.b" -> key "dir/000123", extension "a.b" (lower case); an empty key for names
// without an extension or whose file name starts with '.'
std::pair<std::string, std::string> split_member_name(const std::string& name) {
    const size_t slash = name.rfind('/');
    const size_t start = slash == std::string::npos ? 0 : slash + 1;
    const size_t dot = name.find('.', start);
    if (dot == std::string::npos || dot == start) return {};
    std::string ext = name.substr(dot + 1);
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
    return {name.substr(0, dot), ext};
}

// One shard's samples: members grouped by key. A sample whose members cannot make a sample gets a reason.
struct ShardSamples {
    std::vector<SampleRef> samples;
    std::vector<std::string> problems;  // (samples.size()) empty when the sample is complete
};

ShardSamples group_members(const TarIndex& index, int32_t shard) {
    ShardSamples out;
    std::unordered_map<std::string, size_t> by_key;
    std::vector<std::vector<std::string>> names;  // members of each sample, for messages
    for (const TarMember& m : index.members) {
        const auto [key, ext] = split_member_name(m.name);
        if (key.empty()) continue;
        auto [it, added] = by_key.try_emplace(key, out.samples.size());
        if (added) {
            out.samples.emplace_back();
            out.samples.back().shard = shard;
            out.samples.back().key = key;
            out.problems.emplace_back();
            names.emplace_back();
        }
        SampleRef& s = out.samples[it->second];
        std::string& problem = out.problems[it->second];
        names[it->second].push_back(base_name(m.name));
        MemberRef* field = nullptr;
        if (ext == "txt") field = &s.caption;
        if (ext == "cls") field = &s.label;
        const auto image = std::find(std::begin(kImageExts), std::end(kImageExts), ext);
        if (image != std::end(kImageExts)) {
            const auto rank = static_cast<int8_t>(image - std::begin(kImageExts));
            if (s.image.offset >= 0 && s.image_ext == rank && problem.empty()) {
                problem = fmt::format("the member '{}' appears twice", m.name);
            }
            if (s.image.offset < 0 || rank < s.image_ext) {
                s.image = {m.offset, m.size};
                s.image_ext = rank;
            }
            continue;
        }
        if (field == nullptr) continue;
        if (field->offset >= 0 && problem.empty()) problem = fmt::format("the member '{}' appears twice", m.name);
        *field = {m.offset, m.size};
    }
    for (size_t k = 0; k < out.samples.size(); ++k) {
        if (!out.problems[k].empty()) continue;
        const SampleRef& s = out.samples[k];
        const char* missing = s.image.offset < 0     ? "image (.jpg, .png or .jpeg)"
                              : s.caption.offset < 0 ? "caption (.txt)"
                                                     : nullptr;
        if (missing) {
            out.problems[k] = fmt::format("it has no {}; its members are {}", missing, fmt::join(names[k], ", "));
        }
    }
    return out;
}

// classes.txt next to the first shard: one name per line; trailing blank lines are ignored, inner ones refused
std::vector<std::string> read_classes(const std::string& path) {
    std::vector<std::string> classes;
    std::ifstream in(path);
    if (!in) return classes;
    std::string line;
    int blank_line = 0;
    for (int n = 1; std::getline(in, line); ++n) {
        std::string name = trim(line);
        if (name.empty()) {
            if (blank_line == 0) blank_line = n;
            continue;
        }
        if (blank_line != 0) {
            throw UserError(
                fmt::format("data error: line {} of the class list '{}' is blank, but class names follow "
                            "it (line n names class n - 1); hint: remove the blank line",
                            blank_line, path));
        }
        classes.push_back(std::move(name));
    }
    return classes;
}

class WebDatasetSource final : public ImageTextSource {
  public:
    WebDatasetSource(const std::vector<std::string>& shard_paths, const ImageTextOptions& options);

    int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
    const std::vector<std::string>& classes() const override { return classes_; }
    bool read(int64_t i, int S, ImageTextSample& out) const override;
    int64_t skipped() const override { return dropped_at_open_ + skipped_reads_.load(); }
    std::string describe() const override;
    uint64_t fingerprint() const override { return fingerprint_; }

  private:
    // a bad sample found by read(): throws UserError, or counts it and returns false under skip_bad_samples
    bool bad_sample(const SampleRef& s, const std::string& what) const;
    std::string error_text(int32_t shard, const std::string& key, const std::string& what) const;

    std::vector<std::string> shards_;
    ImageTextOptions options_;
    std::vector<SampleRef> samples_;
    std::vector<std::string> classes_;
    std::string classes_path_;  // empty when there is no classes.txt
    int64_t dropped_at_open_ = 0;
    std::string first_drop_;  // "shard-000.tar:000004: it has no caption (.txt); ..." for the log line
    mutable std::atomic<int64_t> skipped_reads_{0};
    uint64_t fingerprint_ = 0;
};

std::string WebDatasetSource::error_text(int32_t shard, const std::string& key, const std::string& what) const {
    return fmt::format("data error: {} '{}', sample '{}': {}; hint: {}", kWhat, shards_[static_cast<size_t>(shard)],
                       key, what, kSkipHint);
}

WebDatasetSource::WebDatasetSource(const std::vector<std::string>& shard_paths, const ImageTextOptions& options)
    : shards_(shard_paths), options_(options) {
    if (shards_.empty()) {
        throw UserError(fmt::format("data error: no {}s were given; hint: {}", kWhat, kOpenHint));
    }
    uint64_t fp = name_hash("webdataset");
    auto mix = [&fp](uint64_t v) { fp = (fp ^ v) * 1099511628211ull + 0x9E3779B97F4A7C15ull; };
    for (size_t k = 0; k < shards_.size(); ++k) {
        const std::string& path = shards_[k];
        const TarIndex index = read_tar_index(path, kWhat, kOpenHint);
        if (!index.damage.empty() && !options_.skip_bad_samples) {
            throw UserError(
                fmt::format("data error: {} '{}' is {}; hint: re-create or re-download the shard, or set "
                            "skip_bad_samples to use the samples before the damage",
                            kWhat, path, index.damage));
        }
        ShardSamples shard = group_members(index, static_cast<int32_t>(k));
        if (!index.damage.empty()) {
            // the sample being written when the damage begins may be incomplete, even when it looks whole
            for (size_t s = 0; s < shard.samples.size(); ++s) {
                const bool last = !index.members.empty() &&
                                  shard.samples[s].key == split_member_name(index.members.back().name).first;
                const bool damaged =
                    !index.damaged_name.empty() && shard.samples[s].key == split_member_name(index.damaged_name).first;
                if (last || damaged) shard.problems[s] = "the shard is " + index.damage;
            }
        }
        mix(static_cast<uint64_t>(index.file_size));
        mix(index.members.size());
        for (size_t s = 0; s < shard.samples.size(); ++s) {
            if (!shard.problems[s].empty()) {
                if (!options_.skip_bad_samples) {
                    throw UserError(error_text(static_cast<int32_t>(k), shard.samples[s].key, shard.problems[s]));
                }
                if (dropped_at_open_++ == 0) {
                    first_drop_ = fmt::format("{}:{}: {}", base_name(path), shard.samples[s].key, shard.problems[s]);
                }
                continue;
            }
            mix(name_hash(shard.samples[s].key));
            mix(static_cast<uint64_t>(shard.samples[s].image.size));
            samples_.push_back(std::move(shard.samples[s]));
        }
    }
    fingerprint_ = fp;
    if (samples_.empty()) {
        throw UserError(
            fmt::format("data error: the {} {}(s) given, from '{}' on, hold no complete sample ({} dropped); hint: a "
                        "sample is the members KEY.jpg (or .png, .jpeg) and KEY.txt in one shard",
                        shards_.size(), kWhat, shards_.front(), dropped_at_open_));
    }
    const std::filesystem::path list = std::filesystem::path(shards_.front()).parent_path() / "classes.txt";
    classes_ = read_classes(list.string());
    if (!classes_.empty()) classes_path_ = list.string();
}

bool WebDatasetSource::bad_sample(const SampleRef& s, const std::string& what) const {
    if (!options_.skip_bad_samples) throw UserError(error_text(s.shard, s.key, what));
    skipped_reads_.fetch_add(1);
    return false;
}

bool WebDatasetSource::read(int64_t i, int S, ImageTextSample& out) const {
    MS_CHECK(i >= 0 && i < size(), "sample {} outside [0, {})", i, size());
    MS_CHECK(S >= 1, "image side {} < 1", S);
    const SampleRef& s = samples_[static_cast<size_t>(i)];
    const std::string& path = shards_[static_cast<size_t>(s.shard)];
    const ReadOnlyFile file(path, kWhat, kOpenHint);
    auto member = [&](const MemberRef& m, std::string& bytes) {
        bytes.resize(static_cast<size_t>(m.size));
        if (!file.read_at(m.offset, bytes.data(), m.size)) {
            throw UserError(
                fmt::format("data error: {} '{}' has become shorter than when it was opened (sample '{}' "
                            "needs bytes [{}, {})); hint: do not change shards during a run",
                            kWhat, path, s.key, m.offset, m.offset + m.size));
        }
    };
    std::string text;
    member(s.caption, text);
    out.caption = trim(text);
    if (out.caption.empty()) return bad_sample(s, "its caption (.txt) is empty");
    if (!valid_utf8(out.caption)) return bad_sample(s, "its caption (.txt) is not valid UTF-8");
    out.label = -1;
    if (s.label.offset >= 0) {
        member(s.label, text);
        const std::string value = trim(text);
        int label = -1;
        const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), label);
        if (ec != std::errc() || end != value.data() + value.size() || label < 0) {
            return bad_sample(
                s, fmt::format("its label (.cls) holds '{}', not a class index (a number >= 0)", value.substr(0, 40)));
        }
        if (!classes_.empty() && label >= static_cast<int>(classes_.size())) {
            return bad_sample(s, fmt::format("its label (.cls) is {}, but '{}' lists {} classes", label, classes_path_,
                                             classes_.size()));
        }
        out.label = label;
    }
    member(s.image, text);
    const std::string image_name = fmt::format("{}.{}", base_name(s.key), kImageExts[s.image_ext]);
    RgbImage image;
    std::string error;
    if (!decode_image(reinterpret_cast<const uint8_t*>(text.data()), text.size(), S, image, error)) {
        return bad_sample(s, fmt::format("its image '{}' ({} bytes) is {}", image_name, text.size(), error));
    }
    if (image.source_width < options_.min_side || image.source_height < options_.min_side) {
        return bad_sample(s, fmt::format("its image '{}' is {} x {} pixels, smaller than the smallest side accepted, "
                                         "{} (the patch size)",
                                         image_name, image.source_width, image.source_height, options_.min_side));
    }
    out.key = fmt::format("{}:{}", base_name(path), s.key);
    out.pixels.resize(static_cast<size_t>(3) * S * S);
    resize_crop_normalize(image, S, out.pixels.data());
    return true;
}

std::string WebDatasetSource::describe() const {
    return fmt::format("webdataset: {} shard{} ('{}'{}), {} samples, {}{} dropped at open{}", shards_.size(),
                       shards_.size() == 1 ? "" : "s", shards_.front(), shards_.size() > 1 ? ", ..." : "",
                       samples_.size(),
                       classes_.empty() ? std::string("no class list, ")
                                        : fmt::format("{} classes from '{}', ", classes_.size(), classes_path_),
                       dropped_at_open_, first_drop_.empty() ? "" : " (the first: " + first_drop_ + ")");
}

}  // namespace

std::unique_ptr<ImageTextSource> open_webdataset(const std::vector<std::string>& shard_paths,
                                                 const ImageTextOptions& options) {
    return std::make_unique<WebDatasetSource>(shard_paths, options);
}

}  // namespace ms
