// config_yaml.cpp: config_to_yaml() -- every key of every section, in config.h order, such that
// load_config(<that text>, {}) gives back an identical Config.
//
// Floats are written in their shortest round-trip form ("0.0003", "1.0e-08"); a literal "${" inside a resolved
// string is written as "$${" so that reloading does not interpolate it a second time.
#include <yaml-cpp/yaml.h>

#include <set>

#include "engine/config/config.h"
#include "engine/config/config_schema.h"
#include "engine/core/philox.h"

namespace ms {
namespace {

using namespace config_detail;

std::string escape_interpolation(const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s.compare(i, 2, "${") == 0) out += '$';
        out += s[i];
    }
    return out;
}

void emit_value(YAML::Emitter& out, const FieldPtr& ptr) {
    if (auto* s = std::get_if<std::string*>(&ptr)) {
        // quoted with a ':', which YAML 1.1 readers (PyYAML) would take for a sexagesimal number: "2:3" -> 123
        if ((*s)->find(':') != std::string::npos) out << YAML::DoubleQuoted;
        out << escape_interpolation(**s);
    } else if (auto* list = std::get_if<std::vector<std::string>*>(&ptr)) {
        out << YAML::Flow << YAML::BeginSeq;
        for (const std::string& item : **list) out << escape_interpolation(item);
        out << YAML::EndSeq;
    } else if (auto* b = std::get_if<bool*>(&ptr)) {
        out << **b;
    } else {
        out << value_text(ptr);  // numbers: plain scalars
    }
}

// Emits the keys under `prefix` ("" for the top level) in table order, opening a nested mapping for each group.
void emit_group(YAML::Emitter& out, const std::vector<Field>& fields, const std::string& prefix) {
    std::set<std::string> done;
    for (const Field& f : fields) {
        std::string_view path = f.path;
        if (!prefix.empty()) {
            if (path.size() <= prefix.size() || path.substr(0, prefix.size()) != prefix || path[prefix.size()] != '.') {
                continue;
            }
            path.remove_prefix(prefix.size() + 1);
        }
        size_t dot = path.find('.');
        std::string head(path.substr(0, dot));
        if (!done.insert(head).second) continue;
        out << YAML::Key << head << YAML::Value;
        if (dot == std::string_view::npos) {
            emit_value(out, f.ptr);
        } else {
            out << YAML::BeginMap;
            emit_group(out, fields, prefix.empty() ? head : prefix + "." + head);
            out << YAML::EndMap;
        }
    }
}

}  // namespace

std::string config_to_yaml(const Config& cfg) {
    Config copy = cfg;
    std::vector<Field> fields = config_fields(copy);
    YAML::Emitter out;
    out << YAML::Comment("mindspeed-train resolved config") << YAML::Newline;
    out << YAML::BeginMap;
    emit_group(out, fields, "");
    out << YAML::EndMap;
    return std::string(out.c_str()) + "\n";
}

uint64_t config_hash(const Config& cfg) { return name_hash(config_to_yaml(cfg)); }

}  // namespace ms
