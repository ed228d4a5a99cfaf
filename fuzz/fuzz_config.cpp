// fuzz_config.cpp: libFuzzer target for engine/config: load_config_text() (YAML + --set overrides), then
// config_to_yaml() and validate_config(). Any input must either load or be rejected with ms::UserError -- no crash,
// no sanitizer report, no hang, no other exception (libFuzzer reports an escaping exception as a crash).
//
// Two input modes:
//   text     NUL-separated parts: the first is the YAML file, each further one (at most kMaxOverrides) one
//            `--set section.key=value`
//   numbers  byte 0 = 0xFF, then 9-byte records {key index, i64le value}, each `--set <numeric key>=<value>` on
//            no file: the numeric keys (from the default config) take binary values, which libFuzzer's integer
//            mutations drive to the edges (INT_MAX, products that overflow) far sooner than it edits digits in text
// Seeds and a dictionary: fuzz/make_seeds.py (the checked-in configs, overrides, small models, number records).
//
// A config that loads must keep config_yaml.cpp's promise: its config_to_yaml() text loads again, unchanged, and
// emits the same text (the run directory's config.yaml resumes the run). Then validate_config() runs at world
// sizes 1, 8 and 65536, with model.vocab_size filled in as the trainer does for data files; what it derives must
// be consistent. A broken promise is __builtin_trap().
//
// Build and run (Clang only; see fuzz/CMakeLists.txt):
//   CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DMS_BUILD_FUZZERS=ON -DMS_ENABLE_CUDA=OFF -DMS_BUILD_TESTS=OFF
//   ninja -C build-fuzz fuzz_config
//   ./build-fuzz/fuzz_config -dict=build-fuzz/seeds/config.dict build-fuzz/seeds/config
#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/core/check.h"

namespace {

#define FUZZ_CHECK(cond)               \
    do {                               \
        if (!(cond)) __builtin_trap(); \
    } while (0)

constexpr size_t kMaxOverrides = 4;
constexpr uint8_t kNumbersMode = 0xFF;

// Paths of the keys whose default value is a number, read back from the resolved default config.
std::vector<std::string> numeric_keys() {
    std::vector<std::string> keys;
    std::function<void(const YAML::Node&, const std::string&)> walk = [&](const YAML::Node& map,
                                                                          const std::string& prefix) {
        for (const auto& kv : map) {
            const std::string path = prefix.empty() ? kv.first.Scalar() : prefix + "." + kv.first.Scalar();
            if (kv.second.IsMap()) {
                walk(kv.second, path);
            } else if (kv.second.IsScalar()) {
                const std::string& text = kv.second.Scalar();
                char* end = nullptr;
                std::strtod(text.c_str(), &end);
                if (!text.empty() && end == text.c_str() + text.size()) keys.push_back(path);
            }
        }
    };
    walk(YAML::Load(ms::config_to_yaml(ms::Config{})), "");
    return keys;
}

// The input as (YAML text, overrides), per the two modes above.
void split_input(const uint8_t* data, size_t size, std::string& yaml, std::vector<std::string>& overrides) {
    if (size > 0 && data[0] == kNumbersMode) {
        static const std::vector<std::string> keys = numeric_keys();
        for (size_t pos = 1; pos + 9 <= size; pos += 9) {
            int64_t value;
            std::memcpy(&value, data + pos + 1, 8);
            overrides.push_back(keys[data[pos] % keys.size()] + "=" + std::to_string(value));
        }
        return;
    }
    const std::string input(reinterpret_cast<const char*>(data), size);
    for (size_t pos = 0;;) {
        const size_t nul = input.find('\0', pos);
        std::string part = input.substr(pos, nul == std::string::npos ? std::string::npos : nul - pos);
        if (pos == 0) {
            yaml = std::move(part);
        } else {
            overrides.push_back(std::move(part));
        }
        if (nul == std::string::npos || overrides.size() == kMaxOverrides) break;
        pos = nul + 1;
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::string yaml;
    std::vector<std::string> overrides;
    split_input(data, size, yaml, overrides);

    ms::Config cfg;
    try {
        cfg = ms::load_config_text(yaml, "fuzz.yaml", overrides);
    } catch (const ms::UserError&) {
        return 0;  // the only acceptable failure
    }

    // The resolved config reloads unchanged.
    const std::string resolved = ms::config_to_yaml(cfg);
    try {
        FUZZ_CHECK(ms::config_to_yaml(ms::load_config_text(resolved, "resolved.yaml", {})) == resolved);
    } catch (const ms::UserError& e) {
        std::fprintf(stderr, "the resolved config does not reload: %s\n--- resolved.yaml:\n%s\n", e.what(),
                     resolved.c_str());
        __builtin_trap();
    }

    if (cfg.model.vocab_size == 0) cfg.model.vocab_size = 257;  // as the trainer fills it from the data
    for (int world_size : {1, 8, 65536}) {
        try {
            const ms::DerivedConfig d = ms::validate_config(cfg, world_size);
            const int tp = cfg.parallel.tensor_model_parallel_size, pp = cfg.parallel.pipeline_model_parallel_size;
            FUZZ_CHECK(d.world_size == world_size && int64_t{d.dp} * tp * pp == world_size);
            FUZZ_CHECK(d.num_microbatches >= 1 && d.ffn_hidden >= 1);
            FUZZ_CHECK(d.padded_vocab >= cfg.model.vocab_size &&
                       d.padded_vocab % cfg.model.make_vocab_size_divisible_by == 0);
            FUZZ_CHECK(d.tokens_per_step > 0 && d.num_parameters > 0);
        } catch (const ms::UserError&) {
        }
    }
    return 0;
}
