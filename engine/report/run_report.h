// run_report.h: `mindspeed-train report RUN_DIR` -- one self-contained HTML page (inline CSS and SVG, no script,
// nothing fetched) from the files a training run leaves in its run.output_dir (engine/train/run_end.h):
//
//   metrics.jsonl        required: per log interval "lm loss", "learning-rate", "tokens_per_sec", "mfu",
//                        "pipeline_bubble", "exposed_comm", "total_comm", "memory_planned_bytes",
//                        "memory_peak_bytes" (rank 0's); per validation "validation lm loss". When the directory has
//                        none, config.resolved.yaml's logging.metrics_file is tried.
//                        A `selfplay` run's records instead: per iteration "loss", "policy loss", "value loss",
//                        "positions evaluated per second"; per evaluation "vs <opponent>" objects ("win rate", ...).
//   comm_matrix.json     optional: bytes by (source, destination) world rank, summed over the groups, as a heatmap
//   exit_status.json     optional: how the run ended
//   config.resolved.yaml optional: the run's name
//
// A missing optional input (no validation, one rank, no matrix) leaves a sentence on the page in its chart's place.
// Section and chart ids (what the tests look for): chart-loss, chart-lr, chart-throughput, chart-mfu, chart-comm,
// chart-memory, comm-heatmap (self-play: chart-selfplay-loss, chart-win-rate, chart-selfplay-throughput); a missing
// input's sentence is <p class="missing" id="missing-<what>">.
#pragma once

#include <string>

namespace ms::report {

// The page for run directory `run_dir`. Throws UserError when it holds no metrics file.
std::string render_run_report(const std::string& run_dir);

}  // namespace ms::report
