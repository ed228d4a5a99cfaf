// program.h: a chunk's graph compiled to flat programs, one per phase: a list of backend calls, collectives and
// host steps with every tensor's address resolved, so running one makes no decisions and no allocations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "engine/backends/backend.h"
#include "engine/graph/grad_placement.h"
#include "engine/graph/graph.h"
#include "engine/graph/memory_plan.h"

namespace ms::graph {

// Where the tensors of one micro-batch live: the flat parameter buffers and this slot's and the chunk's blocks.
struct Bindings {
    std::byte* weights = nullptr;          // the weights the ops read (dtype Graph::act), flat, parameter-table layout
    const GradPlacement* grads = nullptr;  // the parameter gradients (dtype their tensors say), same offsets
    std::byte* slot = nullptr;             // MemoryPlan::slot_bytes()
    std::byte* scratch = nullptr;          // MemoryPlan::scratch_bytes()
    std::byte* head_grads = nullptr;       // the kHeadGradient tensor's buffer (a graph with one), else unused
};

// Elements [begin, end) of the flat gradient buffer: one parameter's gradient. head_apart: of the tied output layer's
// gradient kept apart (Role::kHeadGradient) instead, in its own buffer (Bindings::head_grads); only a backward's
// on_grads_final reports one.
struct GradRange {
    int64_t begin = 0, end = 0;
    bool head_apart = false;
    bool operator==(const GradRange&) const = default;
};
// Told, during a backward, the gradients that no later op of the graph writes (data-parallel buckets start there),
// or, before a step, the gradients it is the first of its program to write (zero_stage 2 readies their memory).
using GradsFinalFn = std::function<void(std::span<const GradRange>)>;
// Told, before a step, the parameters (their elements of the flat parameter buffer, as GradRange) that it is the
// first of its program to read: they must be in place once this returns (parallel.overlap_param_gather).
using ParamsNeededFn = std::function<void(std::span<const GradRange>)>;

// What a call supplies at run time.
struct RunArgs {
    const int32_t* tokens = nullptr;   // (N) for kLoadTokens
    const int32_t* targets = nullptr;  // (N) for kLoadTargets
    float loss_scale = 1.0f;           // kLossGradient: dloss = loss_scale / N; 0: no backward follows (eval), so
                                       //   ops that prepare it in the forward (the fused LM head) skip that
    const GradsFinalFn* on_grads_final = nullptr;      // backward: called after each step that finished gradients
    const ParamsNeededFn* on_params_needed = nullptr;  // called before each step that first reads parameters
    const GradsFinalFn* on_grads_writing = nullptr;    // backward: called before each step that first writes some
    const int32_t* rows = nullptr;                     // for kLoadRows
};

class Program {
  public:
    struct Step {
        std::string label;  // "h.3.c_fc matmul+gelu"
        std::function<void(const RunArgs&)> run;
    };
    // final_after[i]: the gradients step i is the last to write; needed_before[i]: the parameters step i is the
    // first to read; written_before[i]: the gradients step i is the first to write (each empty, or one list per step)
    explicit Program(std::vector<Step> steps, std::vector<std::vector<GradRange>> final_after = {},
                     std::vector<std::vector<GradRange>> needed_before = {},
                     std::vector<std::vector<GradRange>> written_before = {})
        : steps_(std::move(steps)),
          final_after_(std::move(final_after)),
          needed_before_(std::move(needed_before)),
          written_before_(std::move(written_before)) {}
    Program() = default;
    void run(const RunArgs& args) const {
        for (size_t i = 0; i < steps_.size(); ++i) {
            if (args.on_params_needed != nullptr && i < needed_before_.size() && !needed_before_[i].empty())
                (*args.on_params_needed)(needed_before_[i]);
            if (args.on_grads_writing != nullptr && i < written_before_.size() && !written_before_[i].empty())
                (*args.on_grads_writing)(written_before_[i]);
            steps_[i].run(args);
            if (args.on_grads_final != nullptr && i < final_after_.size() && !final_after_[i].empty())
                (*args.on_grads_final)(final_after_[i]);
        }
    }
    const std::vector<Step>& steps() const { return steps_; }
    const std::vector<std::vector<GradRange>>& final_after() const { return final_after_; }
    const std::vector<std::vector<GradRange>>& needed_before() const { return needed_before_; }

  private:
    std::vector<Step> steps_;
    std::vector<std::vector<GradRange>> final_after_;
    std::vector<std::vector<GradRange>> needed_before_;
    std::vector<std::vector<GradRange>> written_before_;
};

// The program of g's ops of `phase`, with tensors placed by `plan` (made for this chunk with the largest batch; g
// may have fewer rows) and bound to `at`. `loss_sum`, when the graph has a kLoss op, receives the sum over rows of
// the losses at each forward run. The backward program knows after which of its steps each parameter gradient is
// final: after its last writer, or after its first step for one only the forward writes (the fused LM head's).
// Each program knows before which of its steps each parameter it reads is first read. `cp`, the context group, is
// what ring attention ops pass their blocks around (required when the graph has them).
// The parameter gradients of g, as zero_stage 2 places them (engine/optim/sharded_grads.h): `once`, in the order
// the backward writes them and grouped by the op that writes them, those that one backward op writes (accumulating
// into what their memory holds) and nothing else; `kept`, the others: written by several ops (a tied embedding's, by
// the lookup and the output layer) or by the forward (the fused LM head's), so that one micro-batch's backward does
// not make them alone. Each range is one gradient tensor's (several parameters packed back to back where the graph
// writes them as one).
struct GradWrites {
    std::vector<std::vector<GradRange>> once;
    std::vector<GradRange> kept;
};
GradWrites grad_writes(const Graph& g);

Program compile_program(const Graph& g, Phase phase, const MemoryPlan& plan, const Bindings& at, Backend& backend,
                        Communicator& tp, double* loss_sum, Communicator* cp = nullptr);

}  // namespace ms::graph
