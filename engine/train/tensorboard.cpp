// tensorboard.cpp: TensorBoard event files (tensorboard.h): CRC-32C, TFRecord framing, the Event protobuf by hand,
// and the metrics record's scalars.
#include "engine/train/tensorboard.h"

#include <fmt/format.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "engine/core/check.h"

namespace ms {

namespace {

constexpr std::array<uint32_t, 256> make_crc32c_table() {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
        uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        t[i] = c;
    }
    return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// Protobuf wire format: a field's key is (number << 3) | wire type.
enum class Wire : uint8_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
    while (v >= 0x80) {
        out += static_cast<char>((v & 0x7f) | 0x80);
        v >>= 7;
    }
    out += static_cast<char>(v);
}
void put_key(std::string& out, int field, Wire wire) {
    put_varint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire));
}
template <typename T>
void put_little_endian(std::string& out, T value) {  // the host is little-endian (x86-64, aarch64)
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    out.append(bytes, sizeof(T));
}
void put_bytes(std::string& out, int field, std::string_view bytes) {
    put_key(out, field, Wire::kLengthDelimited);
    put_varint(out, bytes.size());
    out += bytes;
}

// Event's wall_time and step (proto3 leaves a zero step out, as its serializers do).
std::string event_header(double wall_time, int64_t step) {
    std::string e;
    put_key(e, 1, Wire::kFixed64);
    put_little_endian(e, wall_time);
    if (step != 0) {
        put_key(e, 2, Wire::kVarint);
        put_varint(e, static_cast<uint64_t>(step));
    }
    return e;
}

double now_unix_seconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Megatron's names for the metrics record's keys that differ from them.
std::string_view megatron_tag(std::string_view key) {
    if (key == "validation lm loss") return "lm loss validation";
    return key;
}

void add_numbers(std::vector<TensorBoardScalar>& out, const std::string& prefix, const nlohmann::json& j,
                 int64_t step) {
    for (const auto& [key, value] : j.items()) {
        if (prefix.empty() && (key == "iteration" || key == "time")) continue;
        const std::string tag = prefix.empty() ? std::string(megatron_tag(key)) : prefix + "/" + key;
        if (value.is_object()) {
            add_numbers(out, tag, value, step);
        } else if (value.is_number()) {
            out.push_back({tag, step, value.get<double>()});
        }
    }
}

}  // namespace

uint32_t crc32c(std::string_view data) {
    uint32_t c = 0xffffffffu;
    for (const char ch : data) c = kCrc32cTable[(c ^ static_cast<uint8_t>(ch)) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(std::string_view data) {
    const uint32_t c = crc32c(data);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
    std::string length;
    put_little_endian(length, static_cast<uint64_t>(data.size()));
    std::string r = length;
    put_little_endian(r, masked_crc32c(length));
    r += data;
    put_little_endian(r, masked_crc32c(data));
    return r;
}

std::string file_version_event(double wall_time) {
    std::string e = event_header(wall_time, 0);
    put_bytes(e, 3, "brain.Event:2");
    return e;
}

std::string session_start_event(double wall_time, int64_t step) {
    std::string session_log;
    put_key(session_log, 1, Wire::kVarint);
    put_varint(session_log, 1);  // SessionLog.START
    std::string e = event_header(wall_time, step);
    put_bytes(e, 7, session_log);
    return e;
}

std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
    std::string v;
    put_bytes(v, 1, tag);
    put_key(v, 2, Wire::kFixed32);
    put_little_endian(v, value);
    std::string summary;
    put_bytes(summary, 1, v);
    std::string e = event_header(wall_time, step);
    put_bytes(e, 5, summary);
    return e;
}

std::vector<TensorBoardScalar> tensorboard_scalars(const nlohmann::json& record) {
    std::vector<TensorBoardScalar> out;
    const auto it = record.find("iteration");
    if (it == record.end() || !it->is_number_integer()) return out;
    add_numbers(out, "", record, it->get<int64_t>());
    if (const auto v = record.find("validation lm loss"); v != record.end() && v->is_number()) {
        out.push_back({"lm loss validation ppl", it->get<int64_t>(), std::exp(v->get<double>())});
    }
    return out;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t first_step) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const double wall_time = now_unix_seconds();
    const std::string base =
        fmt::format("{}/events.out.tfevents.{:010d}.{}", dir, static_cast<int64_t>(wall_time), host_name());
    // "x": never an existing file (a resume within the same second gets the next free suffix)
    for (int n = 0; file_ == nullptr && n < 100; ++n) {
        path_ = n == 0 ? base : fmt::format("{}.{}", base, n);
        file_ = std::fopen(path_.c_str(), "wbx");
        if (file_ == nullptr && errno != EEXIST) break;
    }
    if (file_ == nullptr) {
        throw UserError(
            fmt::format("cannot create a TensorBoard event file in logging.tensorboard_dir '{}': {}\n"
                        "---> HINT: check the directory is writable, or leave logging.tensorboard_dir "
                        "empty to write none",
                        dir, std::strerror(errno)));
    }
    write(file_version_event(wall_time));
    write(session_start_event(wall_time, first_step));
    std::fflush(file_);
}

TensorBoardWriter::~TensorBoardWriter() {
    if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::write(const std::string& event) {
    const std::string record = tfrecord(event);
    std::fwrite(record.data(), 1, record.size(), file_);
}

void TensorBoardWriter::add_record(const nlohmann::json& record) {
    const auto t = record.find("time");
    const double wall_time = t != record.end() && t->is_number() ? t->get<double>() : now_unix_seconds();
    for (const TensorBoardScalar& s : tensorboard_scalars(record)) {
        write(scalar_event(wall_time, s.step, s.tag, static_cast<float>(s.value)));
    }
    std::fflush(file_);
}

}  // namespace ms
