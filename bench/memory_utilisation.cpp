// memory_utilisation.cpp: how much memory a training step's activations and workspaces reserve, (a) allocated one
// by one from a buddy allocator in op order, (b) packed by the static planner into one buddy block.
//   build/memory_utilisation [repeats]        (repeats of the timed allocate/free step, default 200)
//
// The step is the op sequence of engine/model/gpt.cpp (pre-LN GPT-2, fp32, micro-batch B, sequence T): embedding;
// per layer ln1, qkv, attention (out + lse), attention projection, residual, ln2, fc, gelu, fc projection,
// residual; final LayerNorm, logits (B*T, Vp), cross-entropy; then the backward in reverse with its short-lived
// gradients (dfch, dln, datty, dqkv, ...). A forward activation lives from the op that writes it to the last
// backward op that reads it. In-place pairs (all legal, the planner checks): each residual add over its
// projection output, dlogits over logits, dfch (GELU backward) over dfch_gelu, and the residual-gradient
// accumulations of the LayerNorm backwards over the incoming dres. Parameters, gradients and optimizer state are
// not counted: they live for the whole run in any scheme.
//
// Definitions (printed with the table):
//   peak live = max over ops of the bytes live at that op, an in-place pair counted once: the lower bound.
//   (a) reserved = the smallest arena capacity (bisection in 1 MiB steps) for which allocating each buffer at its
//       first op and freeing it after its last op (an in-place output takes over its input's allocation) never
//       fails. "buddy" gives every buffer a power-of-two block; "buddy, trimmed" is the Arena's policy
//       (allocations >= 1 MiB hold round_up(bytes, 256), their tails freed).
//   (b) reserved = the buddy block that holds the plan: round_up(plan total, 256) with the trimmed fit
//       (a power-of-two block, as a classic buddy would give, is printed in the notes).
//   utilisation = peak live / reserved.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/core/timer.h"
#include "memory/buddy_allocator.h"
#include "memory/planner.h"

namespace {

using ms::BlockFit;
using ms::BufferRequest;

constexpr size_t kMinBlock = 256;
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kTrimThreshold = kMiB;  // as Arena's default

struct ModelShape {
    std::string name;
    int64_t L, C, NH, F, Vp, B, T;
};

// The step under construction: op(reads) starts the next op and extends the lifetimes of the buffers it reads;
// out() adds a buffer written by the current op.
struct Step {
    std::vector<BufferRequest> buffers;
    int current = -1;
    void op(std::initializer_list<int> reads = {}) {
        ++current;
        for (int id : reads) buffers[id].last_use = current;
    }
    int out(std::string name, int64_t floats, int inplace_of = -1) {
        buffers.push_back({std::move(name), static_cast<size_t>(floats) * 4, current, current, inplace_of});
        return static_cast<int>(buffers.size()) - 1;
    }
};

std::vector<BufferRequest> gpt_step(const ModelShape& m) {
    const int64_t N = m.B * m.T, C = m.C, F = m.F;
    struct Saved {
        int ln1, ln1_mean, ln1_rstd, qkv, atty, lse, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
    };
    std::vector<Saved> saved(m.L);
    Step s;
    s.op();
    const int tokens = s.out("tokens", N), targets = s.out("targets", N);  // int32: 4 bytes like fp32
    int res = s.out("encoded", N * C);
    std::vector<int> res_in(m.L);
    for (int l = 0; l < m.L; ++l) {
        Saved& x = saved[l];
        const std::string h = fmt::format("h.{}.", l);
        res_in[l] = res;
        s.op({res});
        x.ln1 = s.out(h + "ln1", N * C), x.ln1_mean = s.out(h + "ln1_mean", N), x.ln1_rstd = s.out(h + "ln1_rstd", N);
        s.op({x.ln1});
        x.qkv = s.out(h + "qkv", N * 3 * C);
        s.op({x.qkv});
        x.atty = s.out(h + "atty", N * C), x.lse = s.out(h + "lse", m.B * m.NH * m.T);
        s.op({x.atty});
        const int attn_proj = s.out(h + "attn_proj", N * C);
        s.op({res, attn_proj});
        x.res2 = s.out(h + "res2", N * C, attn_proj);
        s.op({x.res2});
        x.ln2 = s.out(h + "ln2", N * C), x.ln2_mean = s.out(h + "ln2_mean", N), x.ln2_rstd = s.out(h + "ln2_rstd", N);
        s.op({x.ln2});
        x.fch = s.out(h + "fch", N * F);
        s.op({x.fch});
        x.fch_gelu = s.out(h + "fch_gelu", N * F);
        s.op({x.fch_gelu});
        const int mlp_proj = s.out(h + "mlp_proj", N * C);
        s.op({x.res2, mlp_proj});
        res = s.out(h + "res3", N * C, mlp_proj);
    }
    s.op({res});
    const int lnf = s.out("lnf", N * C), lnf_mean = s.out("lnf_mean", N), lnf_rstd = s.out("lnf_rstd", N);
    s.op({lnf});
    const int logits = s.out("logits", N * m.Vp);
    s.op({logits, targets});
    s.out("losses", N);
    const int row_max = s.out("row_max", N), sum_exp = s.out("sum_exp", N);
    // ---- backward ----
    s.op({logits, row_max, sum_exp, targets});
    const int dlogits = s.out("dlogits", N * m.Vp, logits);
    s.op({dlogits, lnf});
    const int dlnf = s.out("dlnf", N * C);
    s.op({dlnf, res, lnf_mean, lnf_rstd});
    int dres = s.out("dres", N * C);
    for (int l = m.L - 1; l >= 0; --l) {
        const Saved& x = saved[l];
        const std::string h = fmt::format("h.{}.", l);
        s.op({dres, x.fch_gelu});
        const int dfch_gelu = s.out(h + "dfch_gelu", N * F);
        s.op({dfch_gelu, x.fch});
        const int dfch = s.out(h + "dfch", N * F, dfch_gelu);
        s.op({dfch, x.ln2});
        const int dln2 = s.out(h + "dln2", N * C);
        s.op({dln2, x.res2, x.ln2_mean, x.ln2_rstd, dres});
        const int dres2 = s.out(h + "dres2", N * C, dres);
        s.op({dres2, x.atty});
        const int datty = s.out(h + "datty", N * C);
        s.op({datty, x.qkv, x.atty, x.lse});
        s.out(h + "attn_bwd_delta", m.B * m.NH * m.T);  // workspace: rowsum(dO * O), this op only
        const int dqkv = s.out(h + "dqkv", N * 3 * C);
        s.op({dqkv, x.ln1});
        const int dln1 = s.out(h + "dln1", N * C);
        s.op({dln1, res_in[l], x.ln1_mean, x.ln1_rstd, dres2});
        dres = s.out(h + "dres1", N * C, dres2);
    }
    s.op({dres, tokens});  // embedding backward
    return s.buffers;
}

// The allocate/free calls of one step in op order: an in-place output takes over its input's allocation; an
// allocation is freed after the last op of its in-place chain.
struct Event {
    bool allocate;
    int slot;  // index of the chain's first buffer
    size_t bytes;
};

std::vector<Event> step_events(const std::vector<BufferRequest>& bufs) {
    const int n = static_cast<int>(bufs.size());
    std::vector<int> root(n), chain_last(n, -1);
    std::vector<bool> claimed(n, false);
    for (int j = 0; j < n; ++j) {
        root[j] = bufs[j].inplace_of == -1 ? j : root[bufs[j].inplace_of];
        if (bufs[j].inplace_of != -1) {
            claimed[bufs[j].inplace_of] = true;
            if (bufs[j].bytes > bufs[root[j]].bytes) {
                fmt::print(stderr, "in-place output {} is larger than its input\n", bufs[j].name);
                std::exit(1);
            }
        }
    }
    int last_op = 0;
    for (const auto& b : bufs) last_op = std::max(last_op, b.last_use);
    std::vector<std::vector<int>> writes(last_op + 1), frees(last_op + 1);
    for (int j = 0; j < n; ++j) {
        if (bufs[j].inplace_of == -1) writes[bufs[j].first_use].push_back(j);
        if (!claimed[j]) frees[bufs[j].last_use].push_back(root[j]);  // the chain's last buffer ends it
    }
    std::vector<Event> events;
    for (int t = 0; t <= last_op; ++t) {
        for (int j : writes[t]) events.push_back({true, j, bufs[j].bytes});
        for (int j : frees[t]) events.push_back({false, j, 0});
    }
    return events;
}

// Runs the step's events once; false on the first failed allocation. offsets: scratch, one per buffer.
bool run_step(ms::BuddyAllocator& b, const std::vector<Event>& events, BlockFit large_fit, std::vector<size_t>& offsets,
              size_t* live_at_failure = nullptr) {
    for (const Event& e : events) {
        if (e.allocate) {
            const auto off = b.allocate(e.bytes, 1, e.bytes >= kTrimThreshold ? large_fit : BlockFit::kPowerOfTwo);
            if (!off) {
                if (live_at_failure) *live_at_failure = b.stats().live_bytes;
                return false;
            }
            offsets[e.slot] = *off;
        } else {
            b.free(offsets[e.slot]);
        }
    }
    return true;
}

bool fits(size_t capacity, const std::vector<Event>& events, BlockFit large_fit, size_t n) {
    ms::BuddyAllocator b(capacity, kMinBlock);
    std::vector<size_t> offsets(n);
    return run_step(b, events, large_fit, offsets);
}

struct BuddyResult {
    size_t reserved;          // smallest capacity that fits (1 MiB steps)
    size_t peak_block_bytes;  // internal fragmentation only
    double us_per_step;
    double ns_per_call;
};

BuddyResult measure_buddy(const std::vector<Event>& events, size_t n, size_t peak_live, BlockFit large_fit,
                          int repeats) {
    size_t hi = std::bit_ceil(std::max(peak_live, kMiB));
    while (!fits(hi, events, large_fit, n)) hi *= 2;
    size_t lo = (peak_live - 1) / kMiB * kMiB;  // below the peak live bytes nothing fits
    while (hi - lo > kMiB) {                    // invariant: hi fits, lo does not
        const size_t mid = (lo + hi) / 2 / kMiB * kMiB;
        if (fits(mid, events, large_fit, n)) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    ms::BuddyAllocator b(hi, kMinBlock);
    std::vector<size_t> offsets(n);
    run_step(b, events, large_fit, offsets);  // warm-up (and the peaks)
    const size_t peak_block = b.stats().peak_block_bytes;
    const double t0 = ms::now_seconds();
    for (int r = 0; r < repeats; ++r) run_step(b, events, large_fit, offsets);
    const double seconds = (ms::now_seconds() - t0) / repeats;
    return {hi, peak_block, seconds * 1e6, seconds * 1e9 / static_cast<double>(events.size())};
}

std::string gib(size_t bytes) { return fmt::format("{:.3f}", static_cast<double>(bytes) / (1024.0 * kMiB)); }

}  // namespace

int main(int argc, char** argv) {
    const int repeats = argc > 1 ? std::atoi(argv[1]) : 200;
    const ModelShape shapes[] = {
        {"gpt2-124m", 12, 768, 12, 3072, 50304, 4, 1024},
        {"gpt2-1.5b-shape", 48, 1600, 25, 6400, 50304, 4, 1024},
    };
    fmt::print(
        "memory_utilisation: fp32 activations + workspaces of one forward+backward step (B=4, T=1024, "
        "Vp=50304), min block {} B\n",
        kMinBlock);
    fmt::print(
        "  utilisation = peak live / reserved; peak live = max over ops of the bytes live at that op "
        "(in-place pairs once)\n"
        "  (a) reserved = smallest arena capacity (bisection, 1 MiB steps) for which allocate-at-first-use / "
        "free-after-last-use in op order never fails\n"
        "  (b) reserved = the one buddy block holding the plan, round_up(plan total, 256) (trimmed fit)\n\n");
    fmt::print("{:<16} {:>7} {:>5} {:>10} | {:<30} {:>12} {:>8} {:>16} {:>20}\n", "config", "buffers", "ops",
               "live GiB", "scheme", "reserved GiB", "util", "peak blocks GiB", "alloc time / step");
    std::vector<std::string> notes;
    for (const ModelShape& m : shapes) {
        const std::vector<BufferRequest> bufs = gpt_step(m);
        const std::vector<Event> events = step_events(bufs);
        const size_t peak_live = ms::peak_live_bytes(bufs);
        const size_t calls = events.size();
        int ops = 0;
        for (const auto& b : bufs) ops = std::max(ops, b.last_use + 1);
        auto row = [&](const std::string& scheme, size_t reserved, const std::string& blocks, const std::string& time) {
            fmt::print("{:<16} {:>7} {:>5} {:>10} | {:<30} {:>12} {:>7.1f}% {:>16} {:>20}\n", m.name, bufs.size(), ops,
                       gib(peak_live), scheme, gib(reserved),
                       100.0 * static_cast<double>(peak_live) / static_cast<double>(reserved), blocks, time);
        };
        for (BlockFit fit : {BlockFit::kPowerOfTwo, BlockFit::kTrimmed}) {
            const BuddyResult r = measure_buddy(events, bufs.size(), peak_live, fit, repeats);
            row(fit == BlockFit::kPowerOfTwo ? "(a) buddy" : "(a) buddy, trimmed >= 1 MiB", r.reserved,
                gib(r.peak_block_bytes), fmt::format("{:.1f} us ({} calls)", r.us_per_step, calls));
            notes.push_back(fmt::format("{} {}: {:.0f} ns per allocate/free call", m.name,
                                        fit == BlockFit::kPowerOfTwo ? "buddy" : "buddy trimmed", r.ns_per_call));
        }
        const double t0 = ms::now_seconds();
        const ms::Plan plan = ms::plan_buffers(bufs, kMinBlock);
        const double plan_ms = (ms::now_seconds() - t0) * 1e3;
        ms::verify_plan(bufs, plan, kMinBlock);
        ms::BuddyAllocator arena(std::bit_ceil(plan.total_bytes), kMinBlock);
        const size_t block = arena.block_bytes(*arena.allocate(plan.total_bytes, kMinBlock, BlockFit::kTrimmed));
        row("(b) planner + one buddy block", block, gib(block), "0 (1 call at setup)");
        notes.push_back(fmt::format(
            "{} planner: total {} B vs peak live {} B (+{:.2f}%), planned in {:.1f} ms; as a power-of-two block: "
            "{} GiB, {:.1f}%",
            m.name, plan.total_bytes, peak_live,
            100.0 * (static_cast<double>(plan.total_bytes) / static_cast<double>(peak_live) - 1.0), plan_ms,
            gib(std::bit_ceil(plan.total_bytes)),
            100.0 * static_cast<double>(peak_live) / static_cast<double>(std::bit_ceil(plan.total_bytes))));
    }
    fmt::print("\n");
    for (const std::string& n : notes) fmt::print("  {}\n", n);
    return 0;
}
