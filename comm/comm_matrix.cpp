// comm_matrix.cpp: see comm_matrix.h.
#include "comm/comm_matrix.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <span>

#include "comm/link_model.h"
#include "engine/core/check.h"
#include "memory/arena.h"

namespace ms {
namespace {

// The gather moves int32 words (the typed collectives have no int64 or double): per (group, destination) the
// bytes' low and high words, the operations and the seconds as float bits; then each group's total seconds.
constexpr size_t kWordsPerPair = 4;

int32_t float_bits(double v) {
    const float f = static_cast<float>(v);
    int32_t w;
    std::memcpy(&w, &f, sizeof(w));
    return w;
}

double bits_float(int32_t w) {
    float f;
    std::memcpy(&f, &w, sizeof(f));
    return f;
}

}  // namespace

int CommMatrix::group_index(std::string_view name) {
    name = name.substr(0, name.find('.'));  // a sub-group ("dp.inter") counts as its group
    const auto at = std::find(kGroups.begin(), kGroups.end(), name);
    return static_cast<int>((at == kGroups.end() ? kGroups.end() - 1 : at) - kGroups.begin());
}

CommMatrix::CommMatrix(int world_rank, NodeLayout nodes)
    : rank_(world_rank), nodes_(std::move(nodes)), sent_(kGroups.size() * nodes_.node_of.size()) {
    MS_CHECK(rank_ >= 0 && rank_ < nodes_.world_size(), "rank {} outside a node layout of {} ranks", rank_,
             nodes_.world_size());
}

void CommMatrix::add_send(int group, int dst, int64_t bytes) {
    const std::lock_guard<std::mutex> lock(mu_);
    PairTraffic& t = sent_.at(static_cast<size_t>(group) * nodes_.node_of.size() + static_cast<size_t>(dst));
    t.bytes += bytes;
    t.ops += 1;
}

void CommMatrix::add_send_seconds(int group, int dst, double seconds) {
    const std::lock_guard<std::mutex> lock(mu_);
    sent_.at(static_cast<size_t>(group) * nodes_.node_of.size() + static_cast<size_t>(dst)).seconds += seconds;
}

PairTraffic CommMatrix::sent(int group, int dst) const {
    const std::lock_guard<std::mutex> lock(mu_);
    return sent_.at(static_cast<size_t>(group) * nodes_.node_of.size() + static_cast<size_t>(dst));
}

nlohmann::json CommMatrix::gather(Communicator& world) const {
    const int W = nodes_.world_size();
    MS_CHECK(world.size() == W && world.rank() == rank_, "the matrix of rank {} of {} gathered over rank {} of {}",
             rank_, W, world.rank(), world.size());
    const size_t G = kGroups.size(), row = G * static_cast<size_t>(W) * kWordsPerPair + G;
    std::vector<int32_t> mine(row), all(row * static_cast<size_t>(W));
    std::unique_lock<std::mutex> lock(mu_);
    for (size_t i = 0; i < sent_.size(); ++i) {
        const uint64_t b = static_cast<uint64_t>(sent_[i].bytes);
        int32_t* w = mine.data() + i * kWordsPerPair;
        w[0] = static_cast<int32_t>(static_cast<uint32_t>(b));
        w[1] = static_cast<int32_t>(static_cast<uint32_t>(b >> 32));
        w[2] = static_cast<int32_t>(std::min<int64_t>(sent_[i].ops, INT32_MAX));
        w[3] = float_bits(sent_[i].seconds);
    }
    for (size_t g = 0; g < G; ++g) mine[sent_.size() * kWordsPerPair + g] = float_bits(op_seconds_[g]);
    lock.unlock();
    world.all_gather(std::span<const int32_t>(mine), std::span<int32_t>(all)).wait();
    if (rank_ != 0) return nullptr;

    nlohmann::json pairs = nlohmann::json::array(), by_group = nlohmann::json::object(),
                   by_link = nlohmann::json::object(), op_seconds = nlohmann::json::object();
    for (size_t g = 0; g < G; ++g) {
        std::vector<double> per_rank;
        for (int src = 0; src < W; ++src) {
            const int32_t* base = all.data() + static_cast<size_t>(src) * row;
            per_rank.push_back(bits_float(base[sent_.size() * kWordsPerPair + g]));
            for (int dst = 0; dst < W; ++dst) {
                const int32_t* w = base + (g * static_cast<size_t>(W) + static_cast<size_t>(dst)) * kWordsPerPair;
                const int64_t bytes = static_cast<int64_t>(static_cast<uint64_t>(static_cast<uint32_t>(w[0])) |
                                                           (static_cast<uint64_t>(static_cast<uint32_t>(w[1])) << 32));
                if (w[2] == 0) continue;
                const char* link = link_class_name(pair_class(nodes_, src, dst));
                const double seconds = bits_float(w[3]);
                pairs.push_back({{"src", src},
                                 {"dst", dst},
                                 {"group", kGroups[g]},
                                 {"link", link},
                                 {"bytes", bytes},
                                 {"ops", w[2]},
                                 {"seconds", seconds}});
                for (nlohmann::json* total : {&by_group[std::string(kGroups[g])], &by_link[link]}) {
                    if (total->is_null()) *total = {{"bytes", int64_t{0}}, {"seconds", 0.0}};
                    (*total)["bytes"] = (*total)["bytes"].get<int64_t>() + bytes;
                    (*total)["seconds"] = (*total)["seconds"].get<double>() + seconds;
                }
            }
        }
        if (std::any_of(per_rank.begin(), per_rank.end(), [](double s) { return s > 0; })) {
            op_seconds[std::string(kGroups[g])] = per_rank;
        }
    }
    std::stable_sort(pairs.begin(), pairs.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
        return a["bytes"].get<int64_t>() > b["bytes"].get<int64_t>();
    });
    return {{"world_size", W},      {"nodes", nodes_.node_of}, {"node_layout", nodes_.describe()}, {"pairs", pairs},
            {"by_group", by_group}, {"by_link", by_link},      {"op_seconds", op_seconds}};
}

std::vector<std::string> comm_matrix_table(const nlohmann::json& matrix, size_t n) {
    const nlohmann::json& pairs = matrix.at("pairs");
    std::vector<std::string> lines;
    lines.push_back(
        fmt::format("comm matrix: the {} of {} (source, destination, group) rows with the most bytes "
                    "sent ({}):",
                    std::min(n, pairs.size()), pairs.size(), matrix.at("node_layout").get<std::string>()));
    lines.push_back(fmt::format("  {:>5} {:>5} {:>6} {:>10} {:>12} {:>8} {:>10}", "src", "dst", "group", "link",
                                "bytes", "ops", "seconds"));
    for (size_t i = 0; i < std::min(n, pairs.size()); ++i) {
        const nlohmann::json& p = pairs[i];
        lines.push_back(fmt::format("  {:>5} {:>5} {:>6} {:>10} {:>12} {:>8} {:>10.3f}", p["src"].get<int>(),
                                    p["dst"].get<int>(), p["group"].get<std::string>(), p["link"].get<std::string>(),
                                    format_bytes(p["bytes"].get<size_t>()), p["ops"].get<int64_t>(),
                                    p["seconds"].get<double>()));
    }
    return lines;
}

}  // namespace ms
