// trainer.h: the training loop: data -> micro-batches -> forward/backward -> clip -> AdamW,
// with Megatron's per-iteration log line, validation, metrics.jsonl and a generated sample at the end.
#pragma once

#include "engine/config/config.h"

namespace ms {

// Runs training as configured. Returns the process exit code. Throws UserError for bad input.
int run_train(const Config& cfg);

// `plan`: print the resolved layout, derived values and per-rank memory for cfg at world_size, allocating nothing.
int run_plan(const Config& cfg, int world_size);

}  // namespace ms
