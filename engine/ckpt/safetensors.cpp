// safetensors.cpp: writer and validating reader; see safetensors.h for the layout and the rules.
#include "engine/ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <utility>

#include "engine/ckpt/atomic_dir.h"
#include "engine/core/check.h"

namespace ms {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors is little-endian; add byte swaps");

using nlohmann::json;

struct DTypeSpec {
    std::string_view name;
    unsigned bits;
    std::optional<DType> engine;
};

// Every dtype of the reference (tensor.rs:811-863); the engine computes in five of them.
constexpr std::array<DTypeSpec, 20> kDTypes = {{
    {"BOOL", 8, std::nullopt},    {"U8", 8, std::nullopt},      {"I8", 8, std::nullopt},   {"F8_E5M2", 8, std::nullopt},
    {"F8_E4M3", 8, std::nullopt}, {"F8_E8M0", 8, std::nullopt}, {"F4", 4, std::nullopt},   {"F6_E2M3", 6, std::nullopt},
    {"F6_E3M2", 6, std::nullopt}, {"I16", 16, std::nullopt},    {"U16", 16, DType::kU16},  {"F16", 16, DType::kF16},
    {"BF16", 16, DType::kBF16},   {"I32", 32, DType::kI32},     {"U32", 32, std::nullopt}, {"F32", 32, DType::kF32},
    {"C64", 64, std::nullopt},    {"F64", 64, std::nullopt},    {"I64", 64, std::nullopt}, {"U64", 64, std::nullopt},
}};

const DTypeSpec* find_dtype(std::string_view name) {
    for (const DTypeSpec& d : kDTypes)
        if (d.name == name) return &d;
    return nullptr;
}

uint64_t checked_numel(const std::vector<int64_t>& shape, bool* overflow) {
    uint64_t n = 1;
    *overflow = false;
    for (const int64_t d : shape) *overflow |= __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n);
    return n;
}

// Errors while reading: "safetensors error: 'model.safetensors': tensor 'h.0.ln_1.weight': <problem>".
[[noreturn]] void fail(const std::string& label, const std::string& msg) {
    throw UserError(fmt::format("safetensors error: '{}': {}", label, msg), kExitCheckpoint);
}

}  // namespace

std::string_view safetensors_dtype(DType t) {
    for (const DTypeSpec& d : kDTypes)
        if (d.engine == t) return d.name;
    MS_UNREACHABLE("no safetensors name for dtype {}", dtype_name(t));
}

int64_t TensorInfo::numel() const {
    int64_t n = 1;
    for (const int64_t d : shape) n *= d;
    return n;
}

// ---- writer ----

void write_safetensors(const std::string& path, const std::vector<TensorEntry>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::function<void(uint64_t)>& on_written) {
    std::set<std::string_view> seen;
    for (const TensorEntry& t : tensors) {
        MS_CHECK(!t.name.empty() && t.name != "__metadata__", "invalid safetensors tensor name '{}'", t.name);
        MS_CHECK(seen.insert(t.name).second, "tensor '{}' given twice for '{}'", t.name, path);
        for (const int64_t d : t.shape) MS_CHECK(d >= 0, "tensor '{}' has a negative dimension {}", t.name, d);
    }
    std::vector<const TensorEntry*> order;
    for (const TensorEntry& t : tensors) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](const TensorEntry* a, const TensorEntry* b) {
        const size_t sa = dtype_size(a->dtype), sb = dtype_size(b->dtype);
        return sa != sb ? sa > sb : a->name < b->name;
    });

    // ordered_json keeps the header in buffer order: metadata first, then tensors by offset (as Rust writes it).
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    std::vector<uint64_t> nbytes;
    uint64_t offset = 0;
    for (const TensorEntry* t : order) {
        bool overflow = false;
        const uint64_t n = checked_numel(t->shape, &overflow) * dtype_size(t->dtype);
        MS_CHECK(!overflow, "tensor '{}' has more elements than fit in 64 bits", t->name);
        MS_CHECK(n == 0 || t->data != nullptr, "tensor '{}' of {} bytes has no data", t->name, n);
        header[t->name] = {
            {"dtype", safetensors_dtype(t->dtype)}, {"shape", t->shape}, {"data_offsets", {offset, offset + n}}};
        nbytes.push_back(n);
        offset += n;
    }
    std::string text;
    try {
        text = header.dump();
    } catch (const json::exception& e) {  // a name or metadata string that is not UTF-8
        throw UserError(fmt::format("safetensors error: cannot write '{}': {}", path, e.what()), kExitCheckpoint);
    }
    text.append((8 - text.size() % 8) % 8, ' ');  // tensor.rs:253-255: keeps the byte buffer 8-byte aligned
    const uint64_t header_len = text.size();

    AtomicFile f(path);
    f.write(&header_len, 8);
    f.write(text);
    for (size_t i = 0; i < order.size(); ++i) {
        f.write(order[i]->data, nbytes[i]);
        if (on_written) on_written(nbytes[i]);
    }
    f.commit();
}

// ---- reader ----

SafetensorsFile SafetensorsFile::open(const std::string& path) {
    SafetensorsFile f;
    f.path_ = path;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(path, fmt::format("cannot open: {}", std::generic_category().message(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(path, "not a regular file");
    }
    f.size_ = static_cast<size_t>(st.st_size);
    if (f.size_ > 0) {
        void* m = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            const int e = errno;
            ::close(fd);
            fail(path, fmt::format("cannot mmap {} bytes: {}", f.size_, std::generic_category().message(e)));
        }
        f.mapping_ = m;
        f.bytes_ = static_cast<const std::byte*>(m);
    }
    ::close(fd);  // the mapping keeps the file
    f.parse();
    return f;
}

SafetensorsFile SafetensorsFile::open_from_memory(std::string_view bytes, const std::string& label) {
    SafetensorsFile f;
    f.path_ = label;
    f.size_ = bytes.size();
    f.owned_ = std::make_unique<std::byte[]>(bytes.size());  // exact size: sanitizers see any overread
    if (!bytes.empty()) std::memcpy(f.owned_.get(), bytes.data(), bytes.size());
    f.bytes_ = f.owned_.get();
    f.parse();
    return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
    if (this != &o) {
        release();
        path_ = std::move(o.path_);
        bytes_ = std::exchange(o.bytes_, nullptr);
        size_ = std::exchange(o.size_, 0);
        mapping_ = std::exchange(o.mapping_, nullptr);
        owned_ = std::move(o.owned_);
        buffer_ = std::exchange(o.buffer_, nullptr);
        names_ = std::move(o.names_);
        infos_ = std::move(o.infos_);
        metadata_ = std::move(o.metadata_);
    }
    return *this;
}

SafetensorsFile::~SafetensorsFile() { release(); }

void SafetensorsFile::release() {
    if (mapping_) ::munmap(mapping_, size_);
    mapping_ = nullptr;
    owned_.reset();
    bytes_ = buffer_ = nullptr;
}

void SafetensorsFile::parse() {
    const std::string& label = path_;
    if (size_ < 8)
        fail(label, fmt::format("the file is {} bytes, too short for the 8-byte header length (truncated?)", size_));
    uint64_t n = 0;
    std::memcpy(&n, bytes_, 8);
    if (n > kSafetensorsMaxHeader)
        fail(label, fmt::format("header length {} is over the {}-byte limit (MAX_HEADER_SIZE): not a safetensors "
                                "file, or a corrupted one",
                                n, kSafetensorsMaxHeader));
    if (n > size_ - 8)
        fail(label, fmt::format("header length {} runs past the end of the {}-byte file (truncated?)", n, size_));
    const char* header = reinterpret_cast<const char*>(bytes_ + 8);
    if (n == 0 || header[0] != '{') fail(label, "the header does not start with '{' (not a safetensors file?)");

    // Duplicate keys are an error (nlohmann keeps the last one silently); a real header nests 3 deep.
    std::vector<std::set<std::string>> keys;
    const json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
        if (depth > 16) fail(label, "the header nests deeper than a safetensors header can");
        if (event == json::parse_event_t::object_start) keys.emplace_back();
        if (event == json::parse_event_t::object_end) keys.pop_back();
        if (event == json::parse_event_t::key && !keys.back().insert(parsed.get<std::string>()).second)
            fail(label, fmt::format("the header has the key '{}' twice", parsed.get<std::string>()));
        return true;
    };
    json root;
    try {
        root = json::parse(header, header + n, on_event);
    } catch (const json::exception& e) {
        fail(label, fmt::format("the header is not valid JSON: {}", e.what()));
    }

    for (const auto& item : root.items()) {
        const std::string& name = item.key();  // not a structured binding: clang 14 cannot capture one
        const json& value = item.value();
        if (name == "__metadata__") {
            if (value.is_null()) continue;
            if (!value.is_object()) fail(label, fmt::format("__metadata__ is {}, not an object", value.type_name()));
            for (const auto& [k, v] : value.items()) {
                if (!v.is_string())
                    fail(label, fmt::format("__metadata__['{}'] is {}; metadata holds strings only (JSON-encode "
                                            "structured values into a string)",
                                            k, v.type_name()));
                metadata_[k] = v.get<std::string>();
            }
            continue;
        }
        const auto bad = [&](const std::string& problem) {
            fail(label, fmt::format("tensor '{}': {}", name, problem));
        };
        if (!value.is_object()) bad(fmt::format("the entry is {}, not an object", value.type_name()));
        TensorInfo info;

        const auto dtype = value.find("dtype");
        if (dtype == value.end() || !dtype->is_string()) bad("no \"dtype\" string");
        const DTypeSpec* spec = find_dtype(dtype->get<std::string>());
        if (!spec)
            bad(
                fmt::format("unknown dtype {} (known: BOOL, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F4, F6_E2M3, F6_E3M2, "
                            "I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64)",
                            dtype->dump()));
        info.dtype_name = spec->name;
        info.dtype = spec->engine;

        const auto shape = value.find("shape");
        if (shape == value.end() || !shape->is_array()) bad("no \"shape\" array");
        for (const json& d : *shape) {
            if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t{INT64_MAX})
                bad(fmt::format("shape {} has {}, not a non-negative integer", shape->dump(), d.dump()));
            info.shape.push_back(d.get<int64_t>());
        }

        const auto offsets = value.find("data_offsets");
        if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
            !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned())
            bad("\"data_offsets\" must be [BEGIN, END] with non-negative integers");
        info.begin = (*offsets)[0].get<uint64_t>();
        info.end = (*offsets)[1].get<uint64_t>();
        if (info.end < info.begin)
            bad(fmt::format("data_offsets [{}, {}] end before they begin", info.begin, info.end));

        bool overflow = false;
        const uint64_t numel = checked_numel(info.shape, &overflow);
        uint64_t bits = 0;
        overflow |= __builtin_mul_overflow(numel, uint64_t{spec->bits}, &bits);
        if (overflow) bad(fmt::format("shape {} overflows 64 bits", shape->dump()));
        if (bits % 8 != 0)
            bad(fmt::format("{} elements of {} ({} bits each) are not a whole number of bytes", numel, spec->name,
                            spec->bits));
        if (info.nbytes() != bits / 8)
            bad(fmt::format("data_offsets [{}, {}] hold {} bytes, but shape {} of {} needs {} bytes", info.begin,
                            info.end, info.nbytes(), shape->dump(), spec->name, bits / 8));
        infos_.emplace(name, std::move(info));
    }

    // The tensors, sorted by offsets, must tile the byte buffer exactly.
    std::vector<std::pair<const std::string*, const TensorInfo*>> by_offset;
    for (const auto& [name, info] : infos_) by_offset.emplace_back(&name, &info);
    std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
        return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
    });
    const uint64_t buffer_len = size_ - 8 - n;
    uint64_t at = 0;
    const std::string* prev = nullptr;
    for (const auto& [name, info] : by_offset) {
        if (info->begin < at)
            fail(label, fmt::format("tensor '{}': bytes [{}, {}) overlap tensor '{}', which ends at byte {}", *name,
                                    info->begin, info->end, *prev, at));
        if (info->begin > at)
            fail(label, fmt::format("tensor '{}': starts at byte {}, but {} ends at byte {}: a hole of {} bytes", *name,
                                    info->begin, prev ? "tensor '" + *prev + "'" : std::string("nothing"), at,
                                    info->begin - at));
        at = info->end;
        prev = name;
    }
    if (at > buffer_len)
        fail(label, fmt::format("tensor '{}': ends at byte {} of the byte buffer, but the file holds {} bytes after "
                                "the header (truncated?)",
                                *prev, at, buffer_len));
    if (at < buffer_len)
        fail(label, fmt::format("the tensors cover {} bytes, but the byte buffer holds {}: {} trailing bytes belong "
                                "to no tensor",
                                at, buffer_len, buffer_len - at));

    buffer_ = bytes_ + 8 + n;
    for (const auto& [name, info] : infos_) names_.push_back(name);
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
    const auto it = infos_.find(name);
    if (it == infos_.end())
        throw UserError(
            fmt::format("safetensors error: '{}' has no tensor '{}' (it holds {} tensors)", path_, name, names_.size()),
            kExitCheckpoint);
    return it->second;
}

const std::byte* SafetensorsFile::data(const std::string& name) const { return buffer_ + info(name).begin; }

}  // namespace ms
