// program.h: a chunk's graph compiled to flat programs, one per phase: a list of backend calls, collectives and
// host steps with every tensor's address resolved, so running one makes no decisions and no allocations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "engine/backends/backend.h"
#include "engine/graph/graph.h"
#include "engine/graph/memory_plan.h"

namespace ms::graph {

// Where the tensors of one micro-batch live: the flat parameter buffers and this slot's and the chunk's blocks.
struct Bindings {
    std::byte* weights = nullptr;  // the weights the ops read (dtype Graph::act), flat, parameter-table layout
    float* grads = nullptr;        // fp32, same layout
    std::byte* slot = nullptr;     // MemoryPlan::slot_bytes()
    std::byte* scratch = nullptr;  // MemoryPlan::scratch_bytes()
};

// What a call supplies at run time.
struct RunArgs {
    const int32_t* tokens = nullptr;   // (N) for kLoadTokens
    const int32_t* targets = nullptr;  // (N) for kLoadTargets
    float loss_scale = 1.0f;           // kLossGradient: dloss = loss_scale / N; 0: no backward follows (eval), so
                                       //   ops that prepare it in the forward (the fused LM head) skip that
};

class Program {
  public:
    struct Step {
        std::string label;  // "h.3.c_fc matmul+gelu"
        std::function<void(const RunArgs&)> run;
    };
    explicit Program(std::vector<Step> steps) : steps_(std::move(steps)) {}
    Program() = default;
    void run(const RunArgs& args) const {
        for (const Step& s : steps_) s.run(args);
    }
    const std::vector<Step>& steps() const { return steps_; }

  private:
    std::vector<Step> steps_;
};

// The program of g's ops of `phase`, with tensors placed by `plan` (made for this chunk with the largest batch; g
// may have fewer rows) and bound to `at`. `loss_sum`, when the graph has a kLoss op, receives the sum over rows of
// the losses at each forward run.
Program compile_program(const Graph& g, Phase phase, const MemoryPlan& plan, const Bindings& at, Backend& backend,
                        Communicator& tp, double* loss_sum);

}  // namespace ms::graph
