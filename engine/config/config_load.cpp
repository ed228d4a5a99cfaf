// config_load.cpp: load_config() -- YAML file + `--set section.key=value` overrides -> resolved Config;
// load_config_text() the same for YAML text in memory (fuzz/fuzz_config.cpp).
//
// Three passes:
//   1. Collect: walk the file's mappings and the overrides, rejecting unknown keys, duplicate keys and sections
//      that are not mappings. Each known key records its YAML node and where it came from ("file:line:col" or
//      "--set"); aliases (use_distributed_optimizer, bf16, fp16) record their target field instead. A later
//      source (--set after the file) replaces an earlier one; two different keys of the same source that set one
//      field to different values are a contradiction.
//   2. Resolve: every field in table order, depth-first through ${section.key} references (cycle-checked):
//      expand ${ENV}, ${ENV:-default} and ${section.key} in the scalar text, then convert it to the field's type.
//      Defaults go through the same expansion (run.output_dir defaults to runs/${run.name}).
//   3. Check: each value against its field's constraint (config_schema.cpp), reported at its location.
// `$${` is a literal `${` (config_to_yaml writes it so that a resolved config reloads unchanged).
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <type_traits>

#include "engine/config/config.h"
#include "engine/config/config_schema.h"
#include "engine/core/check.h"

namespace ms {
namespace {

using namespace config_detail;

std::string parent_of(std::string_view path) {
    size_t dot = path.rfind('.');
    return dot == std::string_view::npos ? "" : std::string(path.substr(0, dot));
}

std::string leaf_of(std::string_view path) {
    size_t dot = path.rfind('.');
    return std::string(dot == std::string_view::npos ? path : path.substr(dot + 1));
}

std::string mark_loc(const std::string& file, const YAML::Mark& mark) {
    if (mark.is_null()) return file;
    return fmt::format("{}:{}:{}", file, mark.line + 1, mark.column + 1);
}

std::string describe_node(const YAML::Node& node) {
    switch (node.Type()) {
        case YAML::NodeType::Null:
            return "null";
        case YAML::NodeType::Sequence:
            return "a list";
        case YAML::NodeType::Map:
            return "a mapping";
        case YAML::NodeType::Scalar:
            return fmt::format("'{}'", node.Scalar());
        default:
            return "nothing";
    }
}

bool is_env_name(std::string_view s) {
    if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
    for (char ch : s) {
        if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_') return false;
    }
    return true;
}

// Longest value that ${...} expansion may produce (far above any path or prompt): references of references can
// otherwise grow a 4 KB config exponentially into gigabytes.
constexpr size_t kMaxExpandedBytes = size_t{1} << 20;

enum class Parse { kOk, kBadText, kOutOfRange };

template <typename T>
Parse parse_integer(const std::string& text, T& out) {
    const char* begin = text.data();
    const char* end = begin + text.size();
    if (begin != end && *begin == '+') ++begin;
    if (begin == end || (std::is_unsigned_v<T> && *begin == '-')) return Parse::kBadText;
    auto [p, ec] = std::from_chars(begin, end, out);
    if (ec == std::errc::result_out_of_range) return Parse::kOutOfRange;
    return (ec == std::errc() && p == end) ? Parse::kOk : Parse::kBadText;
}

// Decimal numbers only: [+-] digits [. digits] [e [+-] digits] (no hex, inf or nan).
template <typename T>
Parse parse_float(const std::string& text, T& out) {
    size_t i = 0, n = text.size();
    if (i < n && (text[i] == '+' || text[i] == '-')) ++i;
    size_t digits = 0;
    while (i < n && std::isdigit(static_cast<unsigned char>(text[i]))) ++i, ++digits;
    if (i < n && text[i] == '.') {
        ++i;
        while (i < n && std::isdigit(static_cast<unsigned char>(text[i]))) ++i, ++digits;
    }
    if (digits == 0) return Parse::kBadText;
    if (i < n && (text[i] == 'e' || text[i] == 'E')) {
        ++i;
        if (i < n && (text[i] == '+' || text[i] == '-')) ++i;
        size_t exp_digits = 0;
        while (i < n && std::isdigit(static_cast<unsigned char>(text[i]))) ++i, ++exp_digits;
        if (exp_digits == 0) return Parse::kBadText;
    }
    if (i != n) return Parse::kBadText;
    errno = 0;
    if constexpr (std::is_same_v<T, float>) {
        out = std::strtof(text.c_str(), nullptr);
    } else {
        out = std::strtod(text.c_str(), nullptr);
    }
    return (errno == ERANGE && std::abs(out) > 1) ? Parse::kOutOfRange : Parse::kOk;
}

class Loader {
  public:
    Loader() : fields_(config_fields(cfg_)), state_(fields_.size(), State::kPending) {
        for (size_t i = 0; i < fields_.size(); ++i) {
            std::string path(fields_[i].path);
            field_index_[path] = i;
            for (std::string p = parent_of(path); !p.empty(); p = parent_of(p)) groups_.insert(p);
        }
        for (const Alias& a : config_aliases()) alias_target_[std::string(a.path)] = std::string(a.target);
        names_.insert(names_.end(), groups_.begin(), groups_.end());
        for (const auto& [path, i] : field_index_) names_.push_back(path);
        for (const auto& [path, target] : alias_target_) names_.push_back(path);
    }
    Loader(const Loader&) = delete;  // fields_ point into cfg_
    Loader& operator=(const Loader&) = delete;

    void load_file(const std::string& file) {
        std::error_code ec;
        if (std::filesystem::is_directory(file, ec)) {
            config_error("", fmt::format("cannot read config file '{}': it is a directory", file));
        }
        YAML::Node root;
        try {
            root = YAML::LoadFile(file);
        } catch (const YAML::BadFile&) {
            bool exists = std::filesystem::exists(file, ec);
            config_error("", fmt::format("cannot read config file '{}': {}", file,
                                         exists ? "permission denied or not a file" : "no such file"));
        } catch (const YAML::ParserException& e) {
            config_error(mark_loc(file, e.mark), "YAML syntax error: " + e.msg);
        }
        load_root(root, file);
    }

    // The same as load_file for YAML text in memory; `name` stands for the file in messages.
    void load_text(const std::string& text, const std::string& name) {
        YAML::Node root;
        try {
            root = YAML::Load(text);
        } catch (const YAML::ParserException& e) {
            config_error(mark_loc(name, e.mark), "YAML syntax error: " + e.msg);
        }
        load_root(root, name);
    }

    void apply_override(const std::string& arg) {
        size_t eq = arg.find('=');
        if (eq == std::string::npos) {
            config_error("--set", fmt::format("'{}' has no '='; expected section.key=value "
                                              "(e.g. --set training.train_iters=100)",
                                              arg));
        }
        std::string path = arg.substr(0, eq), text = arg.substr(eq + 1);
        if (groups_.count(path)) {
            config_error("--set", fmt::format("'{}' is a section, not a key; set one key at a time "
                                              "(e.g. --set {}=value)",
                                              path, first_child(path)));
        }
        if (!field_index_.count(path) && !alias_target_.count(path)) unknown_key(path, "--set", true);
        YAML::Node node;
        try {
            node = YAML::Load(text);
        } catch (const YAML::Exception& e) {
            config_error("--set", fmt::format("{}: value '{}' is not valid YAML ({}); quote it", path, text, e.msg));
        }
        assign(path, node, "--set", /*source=*/1);
    }

    Config finish() {
        for (size_t i = 0; i < fields_.size(); ++i) resolve(i);
        for (const auto& [path, setting] : settings_) cfg_.explicit_keys.push_back(path);
        check_fields(cfg_, &locs_);
        require_model();
        return cfg_;
    }

  private:
    enum class State { kPending, kResolving, kDone };

    // A config names its model's size, as Megatron requires --num-layers, --hidden-size and --num-attention-heads:
    // without them an empty or model-less file would train a default 86M-parameter model without a word. A CLIP
    // model (model.arch: clip) is named by its clip: section, whose preset gives every size.
    void require_model() const {
        if (const auto arch = settings_.find("model.arch");
            arch != settings_.end() && arch->second.node.IsScalar() && arch->second.node.Scalar() == "clip")
            return;
        static constexpr std::string_view kModelKeys[] = {"model.num_layers", "model.hidden_size",
                                                          "model.num_attention_heads"};
        std::vector<std::string_view> missing;
        for (std::string_view key : kModelKeys) {
            if (!settings_.count(std::string(key))) missing.push_back(key);
        }
        if (missing.empty()) return;
        const std::string what =
            settings_.empty()
                ? (file_.empty() ? std::string("no config file was given and no key was set")
                                 : fmt::format("config file '{}' sets nothing", file_))
                : fmt::format("{} {} not set", fmt::join(missing, ", "), missing.size() == 1 ? "is" : "are");
        config_error("", fmt::format("{}: a config must name its model (model.num_layers, model.hidden_size and "
                                     "model.num_attention_heads); hint: start from an example in configs/ "
                                     "(configs/demo.yaml is a small model that trains in minutes on a CPU), or "
                                     "add --set {}=...",
                                     what, missing.front()));
    }

    void load_root(const YAML::Node& root, const std::string& file) {
        file_ = file;
        if (root.IsNull()) return;  // an empty file: require_model() says what is missing
        if (!root.IsMap()) {
            config_error(mark_loc(file, root.Mark()),
                         fmt::format("the top level must be a mapping of sections (run:, model:, ...), got {}",
                                     describe_node(root)));
        }
        walk_map(root, "", file);
    }

    struct Setting {
        YAML::Node node;
        std::string loc;
        int source = 0;      // 0: the file, 1: --set
        std::string origin;  // the key that was written (an alias or the field itself)
    };

    void walk_map(const YAML::Node& map, const std::string& prefix, const std::string& file) {
        std::map<std::string, YAML::Mark> seen;
        for (const auto& kv : map) {
            const YAML::Node& key_node = kv.first;
            const YAML::Node& value = kv.second;
            std::string loc = mark_loc(file, key_node.Mark());
            if (!key_node.IsScalar()) {
                config_error(loc, fmt::format("keys must be plain names, got {}", describe_node(key_node)));
            }
            std::string key = key_node.Scalar();
            std::string path = prefix.empty() ? key : prefix + "." + key;
            if (auto [it, fresh] = seen.emplace(key, key_node.Mark()); !fresh) {
                config_error(loc, fmt::format("duplicate key '{}' (first set at line {})", path, it->second.line + 1));
            }
            if (groups_.count(path)) {
                if (value.IsNull()) continue;  // an empty section
                if (!value.IsMap()) {
                    config_error(mark_loc(file, value.Mark()),
                                 fmt::format("'{}' is a section: expected a mapping of keys, got {}", path,
                                             describe_node(value)));
                }
                walk_map(value, path, file);
            } else if (field_index_.count(path) || alias_target_.count(path)) {
                // A null value has no mark of its own (yaml-cpp points past it); name the key instead.
                assign(path, value, value.IsNull() ? loc : mark_loc(file, value.Mark()), /*source=*/0);
            } else {
                unknown_key(path, loc, false);
            }
        }
    }

    // Resolves an alias to its target, then records the setting (see the contradiction rule at the top).
    void assign(const std::string& path, const YAML::Node& node, const std::string& loc, int source) {
        auto alias = alias_target_.find(path);
        if (alias == alias_target_.end()) {
            record(path, node, loc, source, path);
            return;
        }
        bool on = false;
        if (!node.IsScalar() || !YAML::convert<bool>::decode(node, on)) {
            config_error(loc, fmt::format("{}: expected a boolean (true or false), got {}", path, describe_node(node)));
        }
        if (path == "parallel.use_distributed_optimizer") {
            record(alias->second, YAML::Node(on ? "1" : "0"), loc, source, path);
        } else if (on) {
            record(alias->second, YAML::Node(leaf_of(path)), loc, source, path);
        } else {
            // mixed_precision.bf16 / fp16: false undoes only what the same key turned on (the file's `bf16: true`
            // under `--set mixed_precision.bf16=false`); otherwise it says nothing about the dtype.
            auto it = settings_.find(alias->second);
            if (it != settings_.end() && it->second.origin == path) {
                record(alias->second, YAML::Node("fp32"), loc, source, path);
            }
        }
    }

    void record(const std::string& path, const YAML::Node& node, const std::string& loc, int source,
                const std::string& origin) {
        auto it = settings_.find(path);
        if (it != settings_.end() && it->second.source == source && it->second.origin != origin) {
            const Setting& prev = it->second;
            bool same = prev.node.IsScalar() && node.IsScalar() && prev.node.Scalar() == node.Scalar();
            if (!same) {
                if (path == "mixed_precision.dtype" && prev.origin != path && origin != path) {
                    config_error(loc,
                                 "mixed_precision.bf16 and mixed_precision.fp16 are both true; choose one "
                                 "(or set mixed_precision.dtype: fp32 | bf16 | fp16)");
                }
                config_error(
                    loc, fmt::format("{} sets {} to {}, but {} ({}) sets it to {}; remove one of them", origin, path,
                                     describe_node(node), prev.origin, prev.loc, describe_node(prev.node)));
            }
        }
        settings_[path] = Setting{node, loc, source, origin};
    }

    [[noreturn]] void unknown_key(const std::string& path, const std::string& loc, bool from_cli) {
        std::string parent = parent_of(path), key = leaf_of(path);
        // The same name elsewhere in the schema: a key written in the wrong section.
        std::vector<std::string> elsewhere;
        for (const std::string& name : names_) {
            if (name != path && leaf_of(name) == key) elsewhere.push_back(name);
        }
        std::string what = "unknown key";
        if (parent.empty() && !from_cli) what = elsewhere.empty() ? "unknown section" : "unknown top-level key";
        if (!elsewhere.empty()) {
            if (parent_of(elsewhere[0]).empty()) {
                config_error(loc, fmt::format("{} '{}': '{}' is a top-level section, not a key of '{}'", what, path,
                                              key, parent));
            }
            std::vector<std::string> places;
            for (const std::string& e : elsewhere) places.push_back(fmt::format("'{}' ({})", parent_of(e), e));
            config_error(
                loc, fmt::format("{} '{}': '{}' belongs in section {}", what, path, key, fmt::join(places, " or ")));
        }
        std::vector<std::string> siblings, sibling_paths;
        for (const std::string& name : names_) {
            if (parent_of(name) == parent) {
                siblings.push_back(leaf_of(name));
                sibling_paths.push_back(name);
            }
        }
        std::string near = closest_match(key, siblings);
        if (!near.empty()) {
            std::string shown = from_cli && !parent.empty() ? parent + "." + near : near;
            config_error(loc, fmt::format("{} '{}'; did you mean '{}'?", what, path, shown));
        }
        // Not a typo of a sibling: perhaps a typo of a key in another section.
        std::vector<std::string> all_leaves;
        for (const std::string& name : names_) all_leaves.push_back(leaf_of(name));
        near = closest_match(key, all_leaves);
        if (!near.empty()) {
            for (const std::string& name : names_) {
                if (leaf_of(name) == near) {
                    config_error(loc, fmt::format("{} '{}'; did you mean '{}' (in section '{}')?", what, path, name,
                                                  parent_of(name)));
                }
            }
        }
        config_error(loc, fmt::format("{} '{}'; valid {}: {}", what, path,
                                      parent.empty() ? "top-level keys" : "keys in '" + parent + "'",
                                      fmt::join(siblings, ", ")));
    }

    std::string first_child(const std::string& group) const {
        for (const std::string& name : names_) {
            if (parent_of(name) == group && field_index_.count(name)) return name;
        }
        return group + ".key";
    }

    void resolve(size_t i) {
        const Field& f = fields_[i];
        if (state_[i] == State::kDone) return;
        if (state_[i] == State::kResolving) {
            std::string chain;
            for (const std::string& p : resolving_) chain += p + " -> ";
            config_error(locs_.count(std::string(f.path)) ? locs_[std::string(f.path)] : "",
                         fmt::format("circular ${{}} reference: {}{}", chain, f.path));
        }
        state_[i] = State::kResolving;
        resolving_.emplace_back(f.path);
        auto it = settings_.find(std::string(f.path));
        if (it != settings_.end()) {
            locs_[std::string(f.path)] = it->second.loc;
            set_from_node(f, it->second.node, it->second.loc);
        } else if (auto* s = std::get_if<std::string*>(&f.ptr)) {
            **s = expand(**s, f, "default value");
        }
        resolving_.pop_back();
        state_[i] = State::kDone;
    }

    [[noreturn]] void type_error(const Field& f, const std::string& loc, const std::string& got) {
        config_error(loc, fmt::format("{}: expected {}, got {}", f.path, type_name(f.ptr), got));
    }

    void set_from_node(const Field& f, const YAML::Node& node, const std::string& loc) {
        if (auto* s = std::get_if<std::string*>(&f.ptr)) {
            if (node.IsNull()) {
                (*s)->clear();
            } else if (node.IsScalar()) {
                **s = expand(node.Scalar(), f, loc);
            } else {
                type_error(f, loc, describe_node(node));
            }
            return;
        }
        if (auto* list = std::get_if<std::vector<std::string>*>(&f.ptr)) {
            (*list)->clear();
            if (node.IsScalar()) {
                (*list)->push_back(expand(node.Scalar(), f, loc));
            } else if (node.IsSequence()) {
                for (const YAML::Node& item : node) {
                    if (!item.IsScalar()) type_error(f, loc, "a list containing " + describe_node(item));
                    (*list)->push_back(expand(item.Scalar(), f, loc));
                }
            } else if (!node.IsNull()) {
                type_error(f, loc, describe_node(node));
            }
            return;
        }
        if (!node.IsScalar() && !(node.IsNull() && f.nullable)) type_error(f, loc, describe_node(node));
        std::string text = node.IsNull() ? "null" : node.Scalar();
        if (text.find("${") != std::string::npos) text = expand(text, f, loc);
        set_from_text(f, text, loc);
    }

    void set_from_text(const Field& f, const std::string& text, const std::string& loc) {
        if (f.nullable && (text == "null" || text == "~" || text == "auto" || text.empty())) {
            std::visit(
                [](auto* p) {
                    if constexpr (std::is_arithmetic_v<std::remove_pointer_t<decltype(p)>>) *p = 0;
                },
                f.ptr);
            return;
        }
        Parse result = std::visit(
            [&](auto* p) -> Parse {
                using T = std::remove_pointer_t<decltype(p)>;
                if constexpr (std::is_same_v<T, bool>) {
                    return YAML::convert<bool>::decode(YAML::Node(text), *p) ? Parse::kOk : Parse::kBadText;
                } else if constexpr (std::is_integral_v<T>) {
                    return parse_integer(text, *p);
                } else if constexpr (std::is_floating_point_v<T>) {
                    return parse_float(text, *p);
                } else {
                    return Parse::kBadText;  // strings are handled by set_from_node
                }
            },
            f.ptr);
        if (result == Parse::kBadText) type_error(f, loc, fmt::format("'{}'", text));
        if (result == Parse::kOutOfRange) {
            config_error(loc, fmt::format("{}: {} is out of range for {}", f.path, text,
                                          std::holds_alternative<int*>(f.ptr) ? "a 32-bit integer" : "this key"));
        }
    }

    // Expands ${ENV}, ${ENV:-default} (default used when ENV is unset or empty, as in the shell) and
    // ${section.key}; `$${` is a literal `${`.
    std::string expand(const std::string& text, const Field& f, const std::string& loc) {
        std::string out;
        for (size_t i = 0; i < text.size();) {
            if (text.compare(i, 3, "$${") == 0) {
                out += "${";
                i += 3;
                continue;
            }
            if (text.compare(i, 2, "${") != 0) {
                out += text[i++];
                continue;
            }
            size_t depth = 1, j = i + 2;
            for (; j < text.size() && depth > 0; ++j) {
                if (text.compare(j, 2, "${") == 0)
                    ++depth, ++j;
                else if (text[j] == '}')
                    --depth;
            }
            if (depth != 0) {
                config_error(loc, fmt::format("{}: unterminated '${{' in '{}'", f.path, text));
            }
            out += expand_one(text.substr(i + 2, j - 1 - (i + 2)), f, loc);
            if (out.size() > kMaxExpandedBytes) {
                config_error(loc, fmt::format("{}: the value expands to more than {} characters; hint: a ${{}} "
                                              "reference that repeats another, which repeats another, grows "
                                              "exponentially -- check the references in '{}'",
                                              f.path, kMaxExpandedBytes, text));
            }
            i = j;
        }
        return out;
    }

    std::string expand_one(const std::string& inner, const Field& f, const std::string& loc) {
        size_t sep = inner.find(":-");
        std::string name = inner.substr(0, sep);
        if (name.find('.') != std::string::npos) {
            if (sep != std::string::npos) {
                config_error(loc, fmt::format("{}: '${{{}}}': a default (:-) is only for environment variables; "
                                              "config references always have a value",
                                              f.path, inner));
            }
            auto it = field_index_.find(name);
            if (it == field_index_.end()) {
                std::vector<std::string> paths;
                for (const auto& [p, i] : field_index_) paths.push_back(p);
                std::string near = closest_match(name, paths);
                config_error(loc, fmt::format("{}: '${{{}}}' refers to no config key{}", f.path, name,
                                              near.empty() ? "" : fmt::format("; did you mean '${{{}}}'?", near)));
            }
            resolve(it->second);
            return value_text(fields_[it->second].ptr);
        }
        if (!is_env_name(name)) {
            config_error(loc, fmt::format("{}: '${{{}}}' is neither an environment variable name nor a "
                                          "section.key reference",
                                          f.path, inner));
        }
        const char* value = std::getenv(name.c_str());
        if (sep == std::string::npos) {
            if (!value) {
                config_error(loc, fmt::format("{}: environment variable {} is not set (write ${{{}:-default}} to "
                                              "give a default)",
                                              f.path, name, name));
            }
            return value;
        }
        if (value && *value) return value;
        return expand(inner.substr(sep + 2), f, loc);
    }

    Config cfg_;
    std::vector<Field> fields_;
    std::vector<State> state_;
    std::map<std::string, size_t> field_index_;
    std::set<std::string> groups_;                     // "run", ..., "data", "data.synthetic"
    std::map<std::string, std::string> alias_target_;  // alias path -> field path
    std::vector<std::string> names_;                   // every group, field and alias path
    std::map<std::string, Setting> settings_;          // field path -> the value that wins
    std::map<std::string, std::string> locs_;          // field path -> where it was set
    std::vector<std::string> resolving_;               // the reference chain being resolved
    std::string file_;                                 // the config file (or text's name); "" when none
};

}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
    Loader loader;
    if (!path.empty()) loader.load_file(path);
    for (const std::string& o : overrides) loader.apply_override(o);
    return loader.finish();
}

Config load_config_text(const std::string& yaml, const std::string& name, const std::vector<std::string>& overrides) {
    Loader loader;
    loader.load_text(yaml, name);
    for (const std::string& o : overrides) loader.apply_override(o);
    return loader.finish();
}

}  // namespace ms
