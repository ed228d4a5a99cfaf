// switches.cpp: parse_switches() over kSwitchTable, and the process's switches read once from environ.
#include "engine/core/switches.h"

#include <fmt/format.h>

#include <algorithm>

#include "engine/core/check.h"
#include "engine/core/log.h"

extern char** environ;

namespace ms {
namespace {

// "" and "0" are off, "1" is on; anything else is refused rather than read as off.
bool on_off(std::string_view name, std::string_view value) {
    if (value.empty() || value == "0") return false;
    if (value == "1") return true;
    throw UserError(
        fmt::format("environment switch {}='{}': the value must be 1 (on) or 0 (off)\n---> HINT: write "
                    "{}=1, or unset it",
                    name, value, name));
}

std::string known_names() {
    std::string out;
    for (const SwitchInfo& s : kSwitchTable) out += (out.empty() ? "" : ", ") + std::string(s.name);
    return out;
}

}  // namespace

Switches parse_switches(std::span<const char* const> env) {
    Switches s;
    std::vector<std::pair<std::string_view, std::string_view>> known;  // (name, value) of the set switches
    for (const char* entry : env) {
        if (entry == nullptr) continue;
        const std::string_view e(entry);
        const size_t eq = e.find('=');
        const std::string_view name = e.substr(0, eq), value = eq == std::string_view::npos ? "" : e.substr(eq + 1);
        if (!name.starts_with("MS_")) continue;
        for (const RetiredSwitch& r : kRetiredSwitches) {
            if (name != r.name) continue;
            throw UserError(
                fmt::format("environment variable {}={} is set, but it changes numerics and is now the "
                            "config key {} (part of the config hash)\n---> HINT: unset {} and set the key "
                            "instead ({}), e.g. --set {}=...",
                            name, value, r.config_key, name, r.how, r.config_key));
        }
        const auto it = std::find_if(std::begin(kSwitchTable), std::end(kSwitchTable),
                                     [&](const SwitchInfo& i) { return i.name == name; });
        if (it == std::end(kSwitchTable)) {
            if (std::find(std::begin(kScriptVariables), std::end(kScriptVariables), name) !=
                std::end(kScriptVariables)) {
                continue;
            }
            s.warnings.push_back(
                fmt::format("environment variable {} is not a mindspeed-train switch and is ignored "
                            "(a typo? the switches are {}; a config's ${{{}}} reference is fine)",
                            name, known_names(), name));
            continue;
        }
        known.emplace_back(name, value);
        if (name == "MS_DUMP_GRADS") s.dump_grads = value;
        if (name == "MS_DEFER_OPS") s.defer_ops = on_off(name, value);
        if (name == "MS_PROFILE_OPS") s.profile_ops = on_off(name, value);
        if (name == "MS_INJECT") s.inject = value;
        if (name == "MS_INJECT_CKPT_FAIL") s.inject_ckpt_fail = value;
        if (name == "MS_CHECK_ALLOCS") s.check_allocs = on_off(name, value);
        if (name == "MS_OP_TEST_VERBOSE") s.op_test_verbose = !value.empty();  // the op tests: any value
    }
    for (const SwitchInfo& i : kSwitchTable) {
        for (const auto& [name, value] : known)
            if (name == i.name) s.set.push_back(fmt::format("{}={}", name, value));
    }
    return s;
}

const Switches& switches() {
    static const Switches s = [] {
        std::vector<const char*> env;
        for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.push_back(*e);
        Switches parsed = parse_switches(env);
        for (const std::string& w : parsed.warnings) log_warn("{}", w);
        return parsed;
    }();
    return s;
}

std::string describe_switches(const Switches& s) {
    if (s.set.empty()) return "";
    return fmt::format("environment switches: {}", fmt::join(s.set, " "));
}

std::string describe_switches() { return describe_switches(switches()); }

}  // namespace ms
