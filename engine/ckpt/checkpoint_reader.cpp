// checkpoint_reader.cpp: CheckpointReader -- a committed checkpoint directory, any layout, read as canonical tensors
// (format in checkpoint.h) -- and the shard geometry (shard_box) shared with the save path.
//
// Every stored piece is a box of its tensor's view (plus, for optimizer slices, an element range of that box). A
// request is also a box with an element range (a rank's shard, or the part of it inside its ZeRO-1 range). The copy
// walks the request row by row (a row = a run along the last view dim) and, per row, takes from each piece the
// columns it holds: rows x pieces small loops, memcpy inside. The same layout hits exactly one piece per row.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/ckpt/atomic_dir.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/safetensors.h"
#include "engine/core/check.h"

namespace ms {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

[[noreturn]] void fail(const std::string& msg) { throw UserError("checkpoint error: " + msg, kExitCheckpoint); }

int64_t product(const std::vector<int64_t>& v) {
    int64_t n = 1;
    for (int64_t d : v) n *= d;
    return n;
}

json read_json_file(const std::string& path) {
    std::ifstream f(path);
    if (!f) fail(fmt::format("cannot open '{}'", path));
    json j = json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) fail(fmt::format("'{}' is not a JSON object", path));
    return j;
}

std::vector<int64_t> int_list(const json& j, const char* key, const std::string& where) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_array()) fail(fmt::format("{}: \"{}\" is missing or not a list", where, key));
    std::vector<int64_t> v;
    for (const json& e : *it) {
        if (!e.is_number_integer() || e.get<int64_t>() < 0)
            fail(fmt::format("{}: \"{}\" holds {}, not a non-negative integer", where, key, e.dump()));
        v.push_back(e.get<int64_t>());
    }
    return v;
}

// Model order: wte, wpe, h.<l>.<the per-layer order of gpt_param_table>, ln_f, then anything else by name.
std::tuple<int, int64_t, int, std::string> model_order_key(const std::string& name) {
    static const char* kLayer[] = {"ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
                                   "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
                                   "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
    if (name == "wte.weight") return {0, 0, 0, ""};
    if (name == "wpe.weight") return {0, 0, 1, ""};
    if (name.rfind("h.", 0) == 0) {
        const size_t dot = name.find('.', 2);
        if (dot != std::string::npos) {
            const std::string rest = name.substr(dot + 1);
            const int64_t layer = std::atoll(name.substr(2, dot - 2).c_str());
            for (int i = 0; i < 12; ++i)
                if (rest == kLayer[i]) return {1, layer, i, ""};
            return {1, layer, 12, rest};
        }
    }
    if (name == "ln_f.weight") return {2, 0, 0, ""};
    if (name == "ln_f.bias") return {2, 0, 1, ""};
    return {3, 0, 0, name};
}

}  // namespace

const char* optim_state_name(OptimState s) { return s == OptimState::kExpAvg ? "exp_avg" : "exp_avg_sq"; }

ShardBox shard_box(const ParamInfo& p, int tp_rank, int tp_size) {
    ShardBox b;
    b.view_shape = p.global_shape;
    b.view_offset.assign(p.global_shape.size(), 0);
    b.view_extent = p.shape;
    switch (p.shard) {
        case ShardKind::kReplicated:
            break;
        case ShardKind::kRows:
            b.view_offset[0] = static_cast<int64_t>(tp_rank) * p.shape[0];
            break;
        case ShardKind::kCols:
            b.view_offset[1] = static_cast<int64_t>(tp_rank) * p.shape[1];
            break;
        case ShardKind::kQkvRows: {
            // global rows [Q | K | V], each global_shape[0] / 3; rank r holds rows r*C/tp.. of each block
            const int64_t block = p.global_shape[0] / 3, local = block / tp_size;
            b.view_shape = {3, block};
            b.view_offset = {0, static_cast<int64_t>(tp_rank) * local};
            b.view_extent = {3, local};
            if (p.global_shape.size() == 2) {
                b.view_shape.push_back(p.global_shape[1]);
                b.view_offset.push_back(0);
                b.view_extent.push_back(p.global_shape[1]);
            }
            break;
        }
    }
    return b;
}

CheckpointReader::CheckpointReader(const std::string& dir_in) : dir_(dir_in) {
    while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
    manifest_ = read_json_file(dir_ + "/" + kManifestFile);
    const std::string state_path = dir_ + "/" + kTrainStateFile;
    state_ = train_state_from_json(read_json_file(state_path), state_path);
    const auto model = manifest_.find("model");
    if (model == manifest_.end() || !model->is_object() || !model->contains("vocab_size"))
        fail(fmt::format("'{}/{}' has no \"model\": {{\"vocab_size\": ...}} (not a mindspeed-train checkpoint?)", dir_,
                         kManifestFile));
    vocab_size_ = (*model)["vocab_size"].get<int>();
    const auto files = manifest_.find("files");
    if (files == manifest_.end() || !files->is_object())
        fail(fmt::format("'{}/{}' has no \"files\" object", dir_, kManifestFile));

    for (const auto& [rel, entry] : files->items()) {
        const bool is_model = rel.rfind("model/", 0) == 0, is_optim = rel.rfind("optim/", 0) == 0;
        if ((!is_model && !is_optim) || !rel.ends_with(".safetensors")) continue;
        const std::string path = dir_ + "/" + rel;
        files_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(path)));
        const SafetensorsFile& f = *files_.back();
        for (const std::string& key : f.names()) {
            const std::string where = fmt::format("'{}', tensor '{}'", path, key);
            const TensorInfo& info = f.info(key);
            if (info.dtype_name != "F32") fail(fmt::format("{} is {}; checkpoints hold F32", where, info.dtype_name));
            const auto meta = f.metadata().find(key);
            if (meta == f.metadata().end())
                fail(fmt::format("{} has no entry in __metadata__ saying where it belongs", where));
            const json m = json::parse(meta->second, nullptr, false);
            if (m.is_discarded() || !m.is_object()) fail(fmt::format("{}: its __metadata__ entry is not JSON", where));
            Piece piece{&f, key, int_list(m, "view_offset", where), int_list(m, "view_extent", where), 0, 0};
            const std::vector<int64_t> global = int_list(m, "global_shape", where);
            const std::vector<int64_t> view = int_list(m, "view_shape", where);
            const int64_t box = product(piece.view_extent);
            if (m.contains("range")) {
                const std::vector<int64_t> r = int_list(m, "range", where);
                if (r.size() != 2 || r[0] > r[1] || r[1] > box)
                    fail(fmt::format("{}: range {} is not inside its box of {} elements", where, m["range"].dump(),
                                     box));
                piece.begin = r[0];
                piece.end = r[1];
            } else {
                piece.end = box;
            }
            if (piece.end - piece.begin != info.numel())
                fail(fmt::format("{} holds {} elements, but its metadata describes {}", where, info.numel(),
                                 piece.end - piece.begin));
            if (view.size() != piece.view_offset.size() || view.size() != piece.view_extent.size() ||
                product(view) != product(global))
                fail(fmt::format("{}: view {} does not describe global shape {}", where, m["view_shape"].dump(),
                                 m["global_shape"].dump()));
            for (size_t d = 0; d < view.size(); ++d)
                if (piece.view_offset[d] + piece.view_extent[d] > view[d])
                    fail(fmt::format("{}: box offset {} extent {} leaves view {}", where, m["view_offset"].dump(),
                                     m["view_extent"].dump(), m["view_shape"].dump()));
            std::string name = key;
            std::map<std::string, std::vector<Piece>>* into = &model_pieces_;
            if (is_optim) {
                const size_t slash = key.find('/');
                const std::string kind = key.substr(0, slash == std::string::npos ? 0 : slash);
                if (kind != "exp_avg" && kind != "exp_avg_sq" && kind != "onebit_server_error" &&
                    !kind.starts_with("onebit_worker_error_dp"))
                    fail(
                        fmt::format("{}: optimizer tensors are named exp_avg/<name>, exp_avg_sq/<name>, "
                                    "onebit_server_error/<name> or onebit_worker_error_dpNNNN/<name>",
                                    where));
                name = key.substr(slash + 1);
                into = &optim_pieces_[kind];
            }
            const auto known = shapes_.find(name);
            if (known == shapes_.end()) {
                shapes_[name] = global;
                view_shapes_[name] = view;
            } else if (known->second != global || view_shapes_[name] != view) {
                fail(fmt::format("{}: global shape {} / view {} disagree with another file's for the same tensor",
                                 where, m["global_shape"].dump(), m["view_shape"].dump()));
            }
            (*into)[name].push_back(std::move(piece));
        }
    }
    for (const auto& [name, pieces] : model_pieces_) names_.push_back(name);
    std::sort(names_.begin(), names_.end(),
              [](const std::string& a, const std::string& b) { return model_order_key(a) < model_order_key(b); });
}

CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;

std::optional<std::string> CheckpointReader::latest(const std::string& save_dir, bool verify_checksums) {
    const std::optional<int64_t> it = find_latest_committed(save_dir, verify_checksums);
    if (!it) return std::nullopt;
    return (fs::path(save_dir) / checkpoint_dir_name(*it)).string();
}

bool CheckpointReader::contains(const std::string& name) const { return model_pieces_.count(name) != 0; }

const std::vector<int64_t>& CheckpointReader::global_shape(const std::string& name) const {
    const auto it = shapes_.find(name);
    if (it == shapes_.end() || !contains(name)) fail(fmt::format("'{}' holds no tensor '{}'", dir_, name));
    return it->second;
}

int64_t CheckpointReader::read_box(const std::string& name, std::optional<OptimState> which, const ShardBox& box,
                                   int64_t begin, int64_t end, float* out) const {
    if (which) return read_state_box(name, optim_state_name(*which), box, begin, end, out);
    const auto found = model_pieces_.find(name);
    return read_pieces(found == model_pieces_.end() ? nullptr : &found->second, name, "'" + name + "'", box, begin, end,
                       out);
}

int64_t CheckpointReader::read_state_box(const std::string& name, const std::string& kind, const ShardBox& box,
                                         int64_t begin, int64_t end, float* out) const {
    const auto of_kind = optim_pieces_.find(kind);
    const std::vector<Piece>* pieces = nullptr;
    if (of_kind != optim_pieces_.end()) {
        const auto found = of_kind->second.find(name);
        if (found != of_kind->second.end()) pieces = &found->second;
    }
    return read_pieces(pieces, name, fmt::format("{} of '{}'", kind, name), box, begin, end, out);
}

int64_t CheckpointReader::read_pieces(const std::vector<Piece>* found_pieces, const std::string& name,
                                      const std::string& what, const ShardBox& box, int64_t begin, int64_t end,
                                      float* out) const {
    if (found_pieces == nullptr) fail(fmt::format("'{}' holds no {}", dir_, what));
    const std::vector<Piece>& pieces = *found_pieces;
    const std::vector<int64_t>& saved_view = view_shapes_.at(name);
    const size_t D = box.view_extent.size();
    MS_CHECK(D >= 1 && saved_view.size() == D && box.view_offset.size() == D && begin <= end &&
                 end <= product(box.view_extent),
             "read_box('{}'): a request of rank {} / [{}, {}) for a view of rank {}", name, D, begin, end,
             saved_view.size());
    std::fill(out, out + (end - begin), 0.0f);
    const int64_t n_last = box.view_extent[D - 1];
    std::vector<int64_t> coord(D);  // view coordinates of the current row's first column
    int64_t found = 0, inside = 0;
    for (int64_t j = begin; j < end;) {
        const int64_t row = j / n_last, c0 = j % n_last, c1 = std::min(n_last, c0 + (end - j));
        int64_t r = row;
        bool row_inside = true;
        for (size_t d = D - 1; d-- > 0;) {
            coord[d] = box.view_offset[d] + r % box.view_extent[d];
            r /= box.view_extent[d];
            row_inside = row_inside && coord[d] < saved_view[d];
        }
        const int64_t g0 = box.view_offset[D - 1] + c0, g1 = box.view_offset[D - 1] + c1;  // view columns [g0, g1)
        if (row_inside) inside += std::max<int64_t>(0, std::min(g1, saved_view[D - 1]) - g0);
        for (const Piece& p : pieces) {
            int64_t prow = 0;
            bool hit = true;
            for (size_t d = 0; d + 1 < D && hit; ++d) {
                const int64_t rel = coord[d] - p.view_offset[d];
                hit = rel >= 0 && rel < p.view_extent[d];
                prow = prow * p.view_extent[d] + rel;
            }
            if (!hit) continue;
            const int64_t p0 = p.view_offset[D - 1], p1 = p0 + p.view_extent[D - 1];
            const int64_t lo = std::max(g0, p0), hi = std::min(g1, p1);
            if (lo >= hi) continue;
            // the piece's elements for view columns [lo, hi) of this row, clipped to the elements it holds
            const int64_t k0 = std::max(prow * p.view_extent[D - 1] + (lo - p0), p.begin);
            const int64_t k1 = std::min(prow * p.view_extent[D - 1] + (hi - p0), p.end);
            if (k0 >= k1) continue;
            const int64_t col = lo + (k0 - (prow * p.view_extent[D - 1] + (lo - p0)));  // view column of k0
            std::memcpy(out + (j - begin) + (col - g0), p.file->data(p.key) + (k0 - p.begin) * sizeof(float),
                        static_cast<size_t>(k1 - k0) * sizeof(float));
            found += k1 - k0;
        }
        j += c1 - c0;
    }
    if (found != inside)
        fail(
            fmt::format("'{}': {} of the {} requested elements of {} that lie inside its saved shape {} are {} "
                        "(an incomplete or inconsistent checkpoint)",
                        dir_, std::abs(inside - found), inside, what, json(saved_view).dump(),
                        found < inside ? "in no file" : "in more than one file"));
    return found;
}

CanonicalTensor CheckpointReader::tensor(const std::string& name) const {
    CanonicalTensor t{name, global_shape(name), {}};
    const std::vector<int64_t>& view = view_shapes_.at(name);
    t.data.resize(static_cast<size_t>(product(view)));
    read_box(name, std::nullopt, ShardBox{view, std::vector<int64_t>(view.size(), 0), view}, 0, product(view),
             t.data.data());
    return t;
}

CanonicalTensor CheckpointReader::optimizer_state(const std::string& name, OptimState which) const {
    CanonicalTensor t{name, global_shape(name), {}};
    const std::vector<int64_t>& view = view_shapes_.at(name);
    t.data.resize(static_cast<size_t>(product(view)));
    read_box(name, which, ShardBox{view, std::vector<int64_t>(view.size(), 0), view}, 0, product(view), t.data.data());
    return t;
}

}  // namespace ms
