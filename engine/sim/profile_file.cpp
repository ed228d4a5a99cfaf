// profile_file.cpp: the profile file (profile.h; format in docs/planner.md "Calibration and profiles"). JSON, numbers
// written in their shortest round-trip form, so a profile reads back exactly as it was written.
#include <fmt/ranges.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include <nlohmann/json.hpp>

#include "engine/core/check.h"
#include "engine/sim/profile.h"

namespace ms::sim {

using nlohmann::ordered_json;

namespace {

constexpr const char* kFormat = "mindspeed-train profile";

ordered_json link_json(const LinkParams& l) {
    ordered_json j = {{"alpha_s", l.alpha_s}, {"bytes_per_s", l.bytes_per_s}};
    if (l.reduce_bytes_per_s > 0) j["reduce_bytes_per_s"] = l.reduce_bytes_per_s;  // absent: reductions are free
    return j;
}

// Reads one file: every complaint names it and ends with the hint.
class Reader {
  public:
    explicit Reader(std::string where) : where_(std::move(where)) {}

    [[noreturn]] void fail(const std::string& what) const {
        throw UserError(fmt::format(
            "profile error: '{}' {}\n---> HINT: write a profile with `mindspeed-train calibrate --output FILE`, or "
            "use a built-in estimate ({})",
            where_, what, fmt::join(estimate_profile_names(), ", ")));
    }
    const ordered_json& field(const ordered_json& obj, const char* key, const std::string& in) const {
        if (!obj.is_object() || !obj.contains(key)) fail(fmt::format("has no \"{}\"{}", key, in));
        return obj[key];
    }
    std::string string(const ordered_json& obj, const char* key, const std::string& in = "") const {
        const ordered_json& v = field(obj, key, in);
        if (!v.is_string()) fail(fmt::format("has {} for \"{}\"{}, not a string", v.dump(), key, in));
        return v.get<std::string>();
    }
    bool boolean(const ordered_json& obj, const char* key) const {
        const ordered_json& v = field(obj, key, "");
        if (!v.is_boolean()) fail(fmt::format("has {} for \"{}\", not true or false", v.dump(), key));
        return v.get<bool>();
    }
    // A finite number >= `low` (or > 0 when `positive`).
    double number(const ordered_json& obj, const char* key, const std::string& in, bool positive = false) const {
        const ordered_json& v = field(obj, key, in);
        if (!v.is_number()) fail(fmt::format("has {} for \"{}\"{}, not a number", v.dump(), key, in));
        const double d = v.get<double>();
        if (!std::isfinite(d) || d < 0 || (positive && d == 0))
            fail(fmt::format("has {} for \"{}\"{}, which must be {} 0", v.dump(), key, in, positive ? ">" : ">="));
        return d;
    }
    LinkParams link(const ordered_json& links, const char* key) const {
        const std::string in = fmt::format(" in \"links\".\"{}\"", key);
        const ordered_json& l = field(links, key, " in \"links\"");
        return {number(l, "alpha_s", in), number(l, "bytes_per_s", in, true),
                l.contains("reduce_bytes_per_s") ? number(l, "reduce_bytes_per_s", in, true) : 0.0};
    }
    DType dtype(const ordered_json& table) const {
        const std::string name = string(table, "dtype", " in a \"tables\" entry");
        for (DType t : {DType::kF32, DType::kBF16, DType::kF16})
            if (name == dtype_name(t)) return t;
        fail(fmt::format("has a table for dtype \"{}\"; the dtypes are fp32, bf16 and fp16", name));
    }
    FamilyCurve curve(const ordered_json& families, OpFamily f, DType act) const {
        const std::string in = fmt::format(" in the {} table's \"{}\"", dtype_name(act), family_name(f));
        const ordered_json& c = field(families, family_name(f), fmt::format(" in the {} table", dtype_name(act)));
        FamilyCurve out;
        out.overhead_s = number(c, "overhead_s", in);
        const ordered_json& points = field(c, "points", in);
        if (!points.is_array() || points.empty()) fail(fmt::format("has no [work, rate] pairs in \"points\"{}", in));
        for (const ordered_json& p : points) {
            if (!p.is_array() || p.size() != 2 || !p[0].is_number() || !p[1].is_number() ||
                !std::isfinite(p[0].get<double>()) || !std::isfinite(p[1].get<double>()) || p[0].get<double>() <= 0 ||
                p[1].get<double>() <= 0)
                fail(fmt::format("has {} in \"points\"{}, not a [work, rate] pair of positive numbers", p.dump(), in));
            out.points.push_back({p[0].get<double>(), p[1].get<double>()});
            if (out.points.size() > 1 && out.points.back().work <= out.points[out.points.size() - 2].work)
                fail(fmt::format("has \"points\"{} whose work does not ascend at {}", in, p.dump()));
        }
        return out;
    }

  private:
    std::string where_;
};

}  // namespace

std::string profile_to_json(const Profile& p) {
    ordered_json tables = ordered_json::array();
    for (const DTypeTable& t : p.tables) {
        ordered_json families = ordered_json::object();
        for (size_t i = 0; i < kNumFamilies; ++i) {
            const auto f = static_cast<OpFamily>(i);
            ordered_json points = ordered_json::array();
            for (const RatePoint& r : t.of(f).points) points.push_back({r.work, r.rate});
            families[family_name(f)] = {{"bound", family_bound(f) == Bound::kCompute ? "compute" : "memory"},
                                        {"overhead_s", t.of(f).overhead_s},
                                        {"points", points}};
        }
        ordered_json table = {{"dtype", dtype_name(t.dtype)},
                              {"matmul_peak_flops", t.matmul_peak_flops},
                              {"peak_source", t.peak_source},
                              {"families", families}};
        if (!t.shape_seconds.empty()) table["shape_seconds"] = t.shape_seconds;  // absent: none measured
        tables.push_back(std::move(table));
    }
    const ordered_json j = {
        {"format", kFormat},
        {"version", p.version},
        {"name", p.name},
        {"estimate", p.estimate},
        {"device", p.device},
        {"backend", p.backend},
        {"threads", p.threads},
        {"cores", p.cores},
        {"date", p.date},
        {"source", p.source},
        {"memory_bytes_per_s", p.memory_bytes_per_s},
        {"device_memory_bytes", p.device_memory_bytes},
        {"links",
         {{"intra_node", link_json(p.intra_node)},
          {"inter_node", link_json(p.inter_node)},
          {"source", p.links_source}}},
        {"tables", tables},
    };
    // one [work, rate] pair a line
    static const std::regex kPair(R"(\[\n\s*([-+.0-9eE]+),\n\s*([-+.0-9eE]+)\n\s*\])");
    return std::regex_replace(j.dump(1), kPair, "[$1, $2]") + "\n";
}

Profile profile_from_json(const std::string& text, const std::string& where) {
    const Reader r(where);
    ordered_json j;
    try {
        j = ordered_json::parse(text);
    } catch (const ordered_json::exception& e) {
        r.fail(fmt::format("is not valid JSON ({})", e.what()));
    }
    if (!j.is_object() || !j.contains("format") || j["format"] != kFormat)
        r.fail(fmt::format("is not a profile (its \"format\" is not \"{}\")", kFormat));
    Profile p;
    const ordered_json& version = r.field(j, "version", "");
    if (!version.is_number_integer() || version.get<int64_t>() != Profile::kVersion)
        r.fail(fmt::format("has version {}; this build reads version {}", version.dump(), Profile::kVersion));
    p.name = r.string(j, "name");
    p.estimate = r.boolean(j, "estimate");
    p.device = r.string(j, "device");
    p.backend = r.string(j, "backend");
    p.threads = static_cast<int>(r.number(j, "threads", ""));
    p.cores = static_cast<int>(r.number(j, "cores", ""));
    p.date = r.string(j, "date");
    p.source = r.string(j, "source");
    p.memory_bytes_per_s = r.number(j, "memory_bytes_per_s", "", true);
    p.device_memory_bytes = static_cast<int64_t>(r.number(j, "device_memory_bytes", ""));
    const ordered_json& links = r.field(j, "links", "");
    p.intra_node = r.link(links, "intra_node");
    p.inter_node = r.link(links, "inter_node");
    p.links_source = r.string(links, "source", " in \"links\"");
    const ordered_json& tables = r.field(j, "tables", "");
    if (!tables.is_array() || tables.empty()) r.fail("has no \"tables\" (a list of one table per dtype)");
    for (const ordered_json& t : tables) {
        DTypeTable table;
        table.dtype = r.dtype(t);
        if (p.table(table.dtype) != nullptr) r.fail(fmt::format("has two tables for {}", dtype_name(table.dtype)));
        const std::string in = fmt::format(" in the {} table", dtype_name(table.dtype));
        table.matmul_peak_flops = r.number(t, "matmul_peak_flops", in, true);
        table.peak_source = r.string(t, "peak_source", in);
        const ordered_json& families = r.field(t, "families", in);
        for (const auto& [key, value] : families.items()) {
            bool known = false;
            for (size_t i = 0; i < kNumFamilies; ++i) known = known || key == family_name(static_cast<OpFamily>(i));
            if (!known) r.fail(fmt::format("has an unknown op family \"{}\"{}", key, in));
        }
        for (size_t i = 0; i < kNumFamilies; ++i) {
            const auto f = static_cast<OpFamily>(i);
            table.of(f) = r.curve(families, f, table.dtype);
        }
        if (t.contains("shape_seconds")) {
            const ordered_json& shapes = t["shape_seconds"];
            if (!shapes.is_object())
                r.fail(fmt::format("has {} for \"shape_seconds\"{}, not an object", shapes.dump(), in));
            for (const auto& [key, value] : shapes.items())
                table.shape_seconds[key] =
                    r.number(shapes, key.c_str(), fmt::format(" in \"shape_seconds\"{}", in), true);
        }
        p.tables.push_back(std::move(table));
    }
    return p;
}

Profile load_profile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        const Reader r(path);
        r.fail(std::filesystem::exists(path) ? "cannot be read" : "does not exist");
    }
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return profile_from_json(text, path);
}

void save_profile(const Profile& p, const std::string& path) {
    const std::string text = profile_to_json(p);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out)
        throw UserError(
            fmt::format("profile error: cannot write the profile '{}'\n---> HINT: check that its "
                        "directory exists and is writable",
                        path));
}

}  // namespace ms::sim
