// profile.h: what a device can do, as the step simulator's cost model (cost_model.h) sees it -- measured on the
// backend at hand by `mindspeed-train calibrate` (apps/cmd_calibrate.cpp), or estimated from published peaks for the
// GPUs we plan for (a100-80g, h100, h200) -- and the cost model over it (docs/planner.md "Calibration and profiles").
//
// Every op of a chunk's graph belongs to one op family (OpFamily). A family is compute-bound (its work is counted in
// FLOPs) or memory-bound (its work is the bytes the op reads and writes, engine/graph/report.h's op_bytes). For each
// activation dtype a profile holds, per family, a launch overhead and a rate curve: measured points (work, rate),
// rate in FLOP/s or bytes/s, interpolated piecewise-linearly in log(work) and held constant beyond the end points, so
// that a small op gets the lower efficiency its size gets. An op of work w with f FLOPs and b bytes takes
//   overhead + max(f / flop_rate, b / byte_rate)
// where a compute-bound family's flop_rate is its curve at w = f and its byte_rate the profile's memory bandwidth,
// and a memory-bound family's byte_rate is its curve at w = b and its flop_rate the table's matmul peak. Calibrate
// stores each point's rate as work / (time - overhead), so the formula gives each measured time back.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sim/cost_model.h"

namespace ms::sim {

enum class OpFamily : uint8_t {
    kMatmulForward,       // matmul, matmul + gelu                                      compute
    kMatmulBackward,      // matmul backward (dx and dW)                                compute
    kAttentionForward,    // causal attention, ring attention's blocks                  compute
    kAttentionBackward,   //                                                            compute
    kNormForward,         // layernorm, rmsnorm, residual + layernorm                   memory
    kNormBackward,        //                                                            memory
    kActivationForward,   // gelu, swiglu, rope                                         memory
    kActivationBackward,  // their backward, the bias gradient                          memory
    kResidual,            // a + (b + bias)                                             memory
    kEmbeddingForward,    //                                                            memory
    kEmbeddingBackward,   //                                                            memory
    kCrossEntropy,        // cross-entropy forward and backward                         memory
    kLmHeadLoss,          // the head's matmul, loss and backward, chunk by chunk       compute
    kAdamW,               // the optimizer step                                         memory
    kMemset,              // zeroing, casts, host steps, collectives' local copies      memory
    kCount
};
inline constexpr size_t kNumFamilies = static_cast<size_t>(OpFamily::kCount);
const char* family_name(OpFamily f);  // "matmul_fwd", ... (the profile file's keys)
enum class Bound : uint8_t { kCompute, kMemory };
Bound family_bound(OpFamily f);

// The family, FLOPs and bytes of one op. FLOPs: matmul 2 N M K forward, 2 N M K per product backward (dW, and dx
// when the op writes it); attention as Megatron counts it (2 T^2 C per product, QK^T and PV, per sequence) halved
// for the causal mask, its backward twice the forward; the LM head 2 N C V forward and 6 N C V with the backward;
// elementwise ops 0 (their bytes bound them). A ring-attention op counts one ring step (every step of the ring does
// the same work, the chunk pairing's load balance): cp of them make the op, which the caller, knowing cp, counts.
// Bytes: op_bytes(g, n), except the embedding's: the N rows of its table it touches, not the whole table. The
// tensor-parallel collectives have no work here (their transfers are the simulator's, on the links).
// A fused matmul's GELU (kMatmulGelu's forward, the GELU backward a kMatmulBackward applies to its dx) is an epilogue:
// bytes of its own activation family, counted as the standalone op counts them, timed at that family's rate and added
// to the matmul's time (the CPU runs it as a pass of its own; on a GPU its memory traffic is what it adds).
struct OpWork {
    OpFamily family = OpFamily::kMemset;
    double flops = 0;
    double bytes = 0;
    OpFamily epilogue_family = OpFamily::kActivationForward;
    double epilogue_bytes = 0;  // 0: no epilogue
    double work() const { return family_bound(family) == Bound::kCompute ? flops : bytes; }
};
OpWork op_work(const graph::Graph& g, const graph::Node& n);

// The shape of an op a profile can hold measured as itself (calibrate --world-size), in place of its family's curve:
// the curves are interpolated by work alone, where the same FLOPs take different times at different shapes (a CPU's
// sgemm runs a 1024 x 256 x 1024 product faster per FLOP than a 128 x 256 x 1024 one). dims:
//   matmul_fwd      N, K, M, bias (1: adds one)
//   matmul_bwd      N, K, M, dx (1: writes it), db (1: writes it)
//   attention_fwd   B, T, NH, NKV, HS (causal self-attention; NKV the key/value heads)
//   attention_bwd   the same
//   lm_head_loss    N, C, V, vocab_valid (with its backward)
// A fused GELU is not part of it: op_work's epilogue, timed by its family's curve, is added to the measured time.
// Other ops (ring and cross attention, the memory-bound families) have none.
struct OpShape {
    OpFamily family = OpFamily::kMemset;
    std::vector<int64_t> dims;
    std::string key() const;  // "matmul_bwd 128x256x1024x1x1": the profile file's key
    auto operator<=>(const OpShape&) const = default;
};
std::optional<OpShape> op_shape(const graph::Graph& g, const graph::Node& n);

// The bytes an AdamW step moves per parameter: reads fp32 weight, gradient and both moments, writes weight and
// moments, and with 16-bit weights writes their copy too.
double adamw_bytes_per_element(DType weights);

struct RatePoint {
    double work = 0;  // FLOPs (compute-bound family) or bytes (memory-bound)
    double rate = 0;  // FLOP/s or bytes/s
    bool operator==(const RatePoint&) const = default;
};
struct FamilyCurve {
    double overhead_s = 0;
    std::vector<RatePoint> points;  // ascending work; empty: the family was not measured
    // The rate at `work`: piecewise-linear in log(work) between the points, the end points' rates beyond them.
    double rate_at(double work) const;
    bool operator==(const FamilyCurve&) const = default;
};
// What one activation dtype's ops do.
struct DTypeTable {
    DType dtype = DType::kF32;
    double matmul_peak_flops = 0;  // the MFU denominator: the datasheet's dense peak, or the best measured matmul
    std::string peak_source;       // "measured: best matmul point", "device_peak.cpp: NVIDIA H200 bf16", ...
    std::array<FamilyCurve, kNumFamilies> families;
    // Ops measured at their own shape: OpShape::key() -> seconds (without an epilogue). The cost model takes these
    // over the curves.
    std::map<std::string, double> shape_seconds;
    // shape_seconds of s, or nullptr when the table does not hold it
    const double* measured_seconds(const OpShape& s) const;
    const FamilyCurve& of(OpFamily f) const { return families[static_cast<size_t>(f)]; }
    FamilyCurve& of(OpFamily f) { return families[static_cast<size_t>(f)]; }
    bool operator==(const DTypeTable&) const = default;
};

struct Profile {
    static constexpr int kVersion = 2;
    int version = kVersion;
    std::string name;                          // "cpu", "h200", "a100-80g": what `--profile` and describe() call it
    std::string device;                        // "AMD EPYC 7B13 (OpenBLAS Zen)", "NVIDIA H200"
    std::string backend;                       // "cpu" or "cuda"
    int threads = 0;                           // OpenMP threads the CPU ops ran on (0 on a GPU)
    int cores = 0;                             // the host's hardware threads (0 on a GPU: each rank owns its device)
    std::string date;                          // when it was measured or written, UTC, ISO 8601
    bool estimate = false;                     // true: derived from published peaks, not measured
    std::string source;                        // how the numbers were made, one sentence
    double memory_bytes_per_s = 0;             // large streaming copies: the byte rate of compute-bound ops
    int64_t device_memory_bytes = 0;           // the device's memory (0: host memory)
    LinkParams intra_node, inter_node;         // the links, as comm/link_model.h models them
    std::string links_source;                  // measured, or where the numbers come from
    std::vector<DTypeTable> tables;            // one per activation dtype it holds
    const DTypeTable* table(DType act) const;  // nullptr when it holds none for act
    bool operator==(const Profile& o) const;   // every field (the links' alpha and beta too)
};

// The profile file (JSON; docs/planner.md). Throws UserError naming the file and what is wrong with it.
Profile load_profile(const std::string& path);
void save_profile(const Profile& p, const std::string& path);
std::string profile_to_json(const Profile& p);                                 // the file's text
Profile profile_from_json(const std::string& text, const std::string& where);  // `where` names it in errors

// The built-in estimates: "a100-80g", "h100", "h200". Throws UserError listing those names for any other.
Profile estimate_profile(std::string_view device);
std::vector<std::string> estimate_profile_names();

class ProfileCostModel : public CostModel {
  public:
    explicit ProfileCostModel(Profile p);
    const Profile& profile() const { return p_; }

    std::string describe() const override;
    // The table's shape_seconds of op_shape(g, n) plus the epilogue, when it holds them; else seconds(op_work(g, n),
    // g.act). A ring-attention node's is one step of its ring (the graph does not hold cp).
    double op_seconds(const graph::Graph& g, const graph::Node& n) const override;
    double optimizer_seconds(int64_t elements, DType weights) const override;
    double memory_seconds(int64_t bytes) const override;
    double peak_flops(DType act) const override;
    LinkModel links() const override;
    // max(1, ranks_per_host x threads / cores) on a CPU profile (the ranks run the profile's threads each), 1 on a
    // GPU one (cores 0).
    double oversubscription(int ranks_per_host) const override;

    // The seconds of `w` on the table of `act` (op_seconds without a graph): what calibrate prints beside its
    // measurements.
    double seconds(const OpWork& w, DType act) const;

  private:
    const DTypeTable& table(DType act) const;  // throws UserError when the profile holds no table for act
    Profile p_;
};

}  // namespace ms::sim
