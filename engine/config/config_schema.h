// config_schema.h: the table of every config key, private to engine/config/.
//
// One row per field of Config (config.h): its dotted path ("data.synthetic.seed"), a typed pointer into a
// Config, and its per-value constraint. load_config() parses and type-checks through it, config_to_yaml()
// emits in its order, and both load_config() and validate_config() run check_fields() so that a value
// outside its range is reported with the key, the value and the constraint wherever the Config came from.
// Combinations of values (divisibility, batch arithmetic, backend support) live in config_validate.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/config/config.h"

namespace ms::config_detail {

using FieldPtr =
    std::variant<int*, int64_t*, uint64_t*, float*, double*, bool*, std::string*, std::vector<std::string>*>;

// Allowed values of one field. Numbers: [min, max] with open ends as flagged. Strings: `choices` when non-empty.
// `custom` returns nullptr when the value is fine, else the constraint phrase. `phrase` replaces the generated one.
struct Constraint {
    double min = -1e300;
    double max = 1e300;
    bool min_open = false;
    bool max_open = false;
    std::vector<std::string_view> choices = {};
    const char* (*custom)(const FieldPtr&) = nullptr;
    const char* phrase = nullptr;
    const char* hint = nullptr;
};

struct Field {
    std::string_view path;  // "section.key", "data.synthetic.key" or "schema_version"
    FieldPtr ptr;
    Constraint constraint;
    bool nullable = false;  // `null` / `auto` in YAML mean 0 (= derived)
};

// Every field of `cfg`, in config.h order (which is also the YAML emission order).
std::vector<Field> config_fields(Config& cfg);

// Keys that set another field: parallel.use_distributed_optimizer (-> zero_stage),
// mixed_precision.bf16 / mixed_precision.fp16 (-> dtype).
struct Alias {
    std::string_view path;
    std::string_view target;
};
const std::vector<Alias>& config_aliases();

// "an integer", "a number", "a string", ...
std::string type_name(const FieldPtr& ptr);
// The value as a YAML scalar: 12, 0.0003, true, the raw string; a list as "a,b".
std::string value_text(const FieldPtr& ptr);
// The value for a message: strings quoted ('cosine'), lists in brackets.
std::string value_for_message(const FieldPtr& ptr);
// Shortest text that reads back to the same float/double, with a '.' so YAML 1.1 readers see a float too.
std::string float_text(double v, bool single);

// Throws UserError when a value breaks its field's constraint. `locs` maps paths to where they were set
// ("file:line:col" or "--set"); null when unknown.
void check_fields(const Config& cfg, const std::map<std::string, std::string>* locs);

// "config error: <loc>: <msg>" (or without the location when loc is empty), as a UserError.
[[noreturn]] void config_error(const std::string& loc, const std::string& msg);

size_t edit_distance(std::string_view a, std::string_view b);
// The candidate closest to `key` when it is close enough to be a plausible typo, else "".
std::string closest_match(std::string_view key, const std::vector<std::string>& candidates);

}  // namespace ms::config_detail
