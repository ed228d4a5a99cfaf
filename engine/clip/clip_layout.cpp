// clip_layout.cpp: the checked layout of a CLIP run, and its plan (clip_layout.h).
#include "engine/clip/clip_layout.h"

#include <fmt/format.h>

#include "engine/core/check.h"
#include "engine/core/log.h"
#include "engine/model/gpt_graph.h"
#include "engine/optim/distributed_optimizer.h"
#include "memory/arena.h"

namespace ms {
namespace {

[[noreturn]] void refuse(const std::string& msg) { throw UserError("config error: " + msg); }

}  // namespace

ClipLayout clip_layout(const Config& cfg, int world) {
    const ParallelConfig& p = cfg.parallel;
    if (p.pipeline_model_parallel_size != 1)
        refuse(
            fmt::format("parallel.pipeline_model_parallel_size({}) with model.arch: clip: the contrastive loss needs "
                        "every sample's features from both towers before any backward starts, so the towers run "
                        "whole on each rank; hint: use tensor parallelism (tensor_model_parallel_size) instead",
                        p.pipeline_model_parallel_size));
    if (p.context_parallel_size != 1 || p.sequence_parallel)
        refuse(
            "model.arch: clip has no context or sequence parallelism; hint: set parallel.context_parallel_size: 1 "
            "and parallel.sequence_parallel: false");
    if (p.zero_stage > 1 || cfg.optimizer.type != "adamw")
        refuse(
            fmt::format("model.arch: clip trains with optimizer.type adamw and parallel.zero_stage 0 or 1 (got '{}' "
                        "and {})",
                        cfg.optimizer.type, p.zero_stage));
    if (cfg.data.source != "shapes" && cfg.data.source != "webdataset")
        refuse(
            fmt::format("data.source = '{}' holds tokens; model.arch: clip reads image-text pairs: data.source "
                        "shapes (drawn shapes with captions) or webdataset (tar shards of key.png/.jpg + key.txt)",
                        cfg.data.source));
    ClipLayout l;
    l.tp = p.tensor_model_parallel_size;
    if (world % l.tp != 0)
        refuse(fmt::format("parallel.tensor_model_parallel_size({}) does not divide the world size {}", l.tp, world));
    l.dp = world / l.tp;
    l.shape = resolve_clip_shape(cfg.clip, l.tp);
    l.b = cfg.training.micro_batch_size;
    l.global_batch = int64_t{l.b} * l.dp;
    if (l.shape.cross_modal() && l.b < 2)
        refuse(
            fmt::format("clip.cross_modal_layers({}) pairs each sample with hard negatives from the rank's other "
                        "samples, and training.micro_batch_size is {}; hint: set micro_batch_size to 2 or more",
                        cfg.clip.cross_modal_layers, l.b));
    if (cfg.training.global_batch_size != 0 && cfg.training.global_batch_size != l.global_batch)
        refuse(
            fmt::format("training.global_batch_size({}) is not micro_batch_size({}) x data-parallel ranks({}) = {}: "
                        "a contrastive batch's negatives are the whole global batch, so CLIP takes one micro-batch "
                        "per rank and step (no accumulation); hint: set global_batch_size to {} or 0",
                        cfg.training.global_batch_size, l.b, l.dp, l.global_batch, l.global_batch));
    l.dtype = model_dtype(cfg.mixed_precision);
    if (l.dtype == DType::kF16)
        refuse(
            "model.arch: clip trains in fp32 or bf16 (fp16 would need loss scaling of the features); hint: set "
            "mixed_precision.dtype: bf16");
    if (shards_master_weights(p.zero_stage, l.dtype))
        refuse(
            "model.arch: clip keeps whole fp32 master weights, which bf16 with zero_stage 1 would shard; hint: set "
            "parallel.zero_stage: 0, or train in fp32");
    for (const ParamInfo& q : clip_param_table(l.shape, 1)) l.num_params += q.numel;
    return l;
}

void log_clip_layout(const ClipLayout& l) {
    const ClipShape& s = l.shape;
    log_info(
        "clip: image tower {} layers x {} ({} heads, MLP {}) on {}x{} images in {}-pixel patches; text tower {} "
        "layers x {} ({} heads, MLP {}), {} tokens; embedding {}; {} parameters ({:.2f} M); {}",
        s.vision.L, s.vision.C, s.vision.NH, s.vision.F, s.image_size(), s.image_size(), s.vision.patch, s.text.L,
        s.text.C, s.text.NH, s.text.F, s.text.T, s.embed_dim, l.num_params, static_cast<double>(l.num_params) / 1e6,
        dtype_name(l.dtype));
    if (s.cross_modal())
        log_info(
            "clip: {} cross-modal layers x {} ({} heads, MLP {}) with an image-text matching head on {} pairs per "
            "rank (each sample, a hard-negative caption, a hard-negative image)",
            s.fusion.L, s.fusion.C, s.fusion.NH, s.fusion.F, 3 * l.b);
    log_info("clip: world {} = tp {} x dp {}; global batch {} ({} per rank)", l.tp * l.dp, l.tp, l.dp, l.global_batch,
             l.b);
}

int run_clip_plan(const Config& cfg, int world_size, double memory_gib) {
    const ClipLayout l = clip_layout(cfg, world_size);
    log_clip_layout(l);
    const std::vector<ParamInfo> table = clip_param_table(l.shape, l.tp);
    const int64_t flat = table.back().offset + table.back().numel, padded = padded_flat_size(flat, l.dp);
    const GptPart tower{.first_layer = 0, .num_layers = -1, .embedding = true, .head = false};
    struct Row {
        const char* what;
        int64_t bytes;
    };
    std::vector<Row> rows = {{"parameters (fp32)", padded * 4}, {"gradients (fp32)", padded * 4}};
    if (l.dtype != DType::kF32)
        rows.push_back({"weights (16-bit)", padded * static_cast<int64_t>(dtype_size(l.dtype))});
    rows.push_back({"optimizer state",
                    optimizer_blocks(table, flat, cfg.optimizer, cfg.parallel.zero_stage, l.dtype, l.dp).total()});
    struct Chunk {
        const char* what;
        const GptShape* shape;
        int batch;
    };
    std::vector<Chunk> chunks = {{"image tower activations", &l.shape.vision, l.b},
                                 {"text tower activations", &l.shape.text, l.b}};
    if (l.shape.cross_modal()) chunks.push_back({"cross-modal activations", &l.shape.fusion, 3 * l.b});
    for (const Chunk& c : chunks) {
        const graph::MemoryPlan plan = plan_gpt_memory(*c.shape, tower, l.tp, c.batch, false, l.dtype);
        rows.push_back({c.what, static_cast<int64_t>(plan.slot_bytes() + plan.scratch_bytes())});
    }
    int64_t total = 0;
    log_info("\nmemory per rank (every rank holds the same):");
    for (const Row& r : rows) {
        log_info("  {:<26} {:>12}", r.what, format_bytes(static_cast<size_t>(r.bytes)));
        total += r.bytes;
    }
    log_info("  {:<26} {:>12}", "total", format_bytes(static_cast<size_t>(total)));
    if (memory_gib > 0) {
        const double budget = memory_gib * double(int64_t{1} << 30);
        log_info("  budget {} per rank: {}", format_bytes(static_cast<size_t>(budget)),
                 static_cast<double>(total) <= budget ? "fits" : "does NOT fit");
        if (static_cast<double>(total) > budget) return kExitConfigError;
    }
    return kExitOk;
}

}  // namespace ms
