#!/usr/bin/env python3
"""gpt2_bench.py: GPT-2 124M training throughput on one GPU, mindspeed-train against PyTorch, in one run.

  python3 bench/gpu/gpt2_bench.py --binary build-gpu/mindspeed-train --out DIR [--budget 200] [--batch 4] [--steps 20]

The model is configs/gpt2-124m.yaml (12 layers, hidden 768, 12 heads, seq 1024, vocab 50257 padded to 50304), one
micro-batch of --batch sequences per step (no accumulation), synthetic tokens (data.source: synthetic; throughput
does not depend on the data). Runs, one after another, each bounded by its share of --budget seconds, in the order
3, 4, 1, 5, 2, 6 (the bf16 pair first, the TF32 pair last: the one squeezed when time runs short):
  1. mindspeed-train, run.backend: cuda, fp32 (the CUDA backend's kernels and cuBLAS GEMMs, TF32 off), --steps steps;
  2. the same with debug.cuda_tf32: true (the GEMMs on TF32 tensor cores);
  3. the same in mixed precision, mixed_precision.dtype: bf16 (bf16 activations and weights, bf16 GEMMs with fp32
     accumulation, fp32 master weights, gradients and AdamW state);
  4. PyTorch bf16 autocast, torch.compile + F.scaled_dot_product_attention + fused AdamW (bench/torch_gpt2_bench.py);
  5. PyTorch fp32 (TF32 off), the same;
  6. PyTorch with TF32 matmuls, the same.
Then, with 40 s of a budget of 150 s or more kept for it, a 6-step bf16 run of ours under MS_PROFILE_OPS=1 (every op
timed alone: engine/backends/profiling_backend.h), whose op table goes under the results: where a step goes, not a
speed. A PyTorch run whose compile fails is repeated in eager mode if time is left, and labelled so. Each is timed as the
median step after the first warm-up steps (3 for mindspeed-train, 3 for PyTorch: torch.compile happens there).

MFU = model FLOPs per token (Megatron's formula, as the trainer's: 3 x forward, attention included) x tokens/s over
the device's dense peak from the table below (NVIDIA datasheets; the C++ trainer's is engine/train/device_peak.cpp):
against the peak of the run's own precision (fp32 without tensor cores, TF32 or bf16), and against the bf16
tensor-core peak, labelled. An unknown device gets "n/a" and a loud line. The summary line under the table gives
mindspeed-train bf16 over PyTorch torch.compile bf16 (tokens/s) as a ratio, and fp32 over fp32.
Prints one table; writes it to DIR/gpt2_bench.md, the numbers to DIR/gpt2_bench.json, each run's log to DIR/*.log
and each mindspeed-train run's metrics.jsonl under DIR/mindspeed-train*-run/. Exit status 0 when mindspeed-train
produced a number in fp32 and in bf16, 1 otherwise.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# Dense FLOP/s: name (substring of the CUDA device name; more specific first) -> fp32 non-tensor, tf32, bf16.
PEAKS = [
    ("H200 NVL", 60.0e12, 417.5e12, 835.5e12),
    ("H200", 66.9e12, 494.7e12, 989.4e12),
    ("H100 NVL", 60.0e12, 417.5e12, 835.5e12),
    ("H100 PCIe", 51.2e12, 378.0e12, 756.0e12),
    ("H100", 66.9e12, 494.7e12, 989.4e12),
    ("A100", 19.5e12, 156.0e12, 312.0e12),
]
L, C, NH, F, T, V, VP = 12, 768, 12, 3072, 1024, 50257, 50304
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def flops_per_token():
    """Megatron's num_floating_point_operations per token (engine/model/gpt.cpp gpt_train_flops_per_token)."""
    per_layer = 2.0 * (3 * C * C + C * C + 2 * C * F) + 2.0 * 2.0 * T * C
    return 3.0 * (L * per_layer + 2.0 * C * VP)


def device_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.strip().splitlines()
        return out[0].strip() if out else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def find_peak(name):
    for key, fp32, tf32, bf16 in PEAKS:
        if key in name:
            return {"device": key, "fp32": fp32, "tf32": tf32, "bf16": bf16}
    return None


def run(cmd, log_path, seconds, env=None):
    """Runs cmd with stdout+stderr to log_path, killed after `seconds`. Returns (exit code or 'timeout', seconds)."""
    t0 = time.time()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=max(seconds, 1), cwd=ROOT,
                                env=env).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return rc, time.time() - t0


PRECISION = {"fp32": "fp32 (TF32 off)", "tf32": "fp32, TF32 GEMMs", "bf16": "bf16 autocast"}
OURS_PRECISION = dict(PRECISION, bf16="bf16 mixed precision (fp32 master)")


def mindspeed(binary, out, batch, steps, seconds, kind, profile=False):
    """mindspeed-train on run.backend: cuda; kind tf32 sets debug.cuda_tf32=true (the CUDA backend's cuBLAS GEMMs), kind bf16
    mixed_precision.dtype: bf16; profile sets MS_PROFILE_OPS=1 (every op timed alone: the op table, not a speed)."""
    label = "mindspeed-train" + ("" if kind == "fp32" else "-" + kind) + ("-profile" if profile else "")
    run_dir = os.path.join(out, label + "-run")
    sets = {
        "run.backend": "cuda", "run.output_dir": run_dir, "data.source": "synthetic",
        "data.synthetic.vocab_size": V, "data.synthetic.num_tokens": 1 << 20, "model.vocab_size": V,
        "training.micro_batch_size": batch, "training.global_batch_size": batch, "training.train_iters": steps,
        "lr_schedule.lr_warmup_iters": 2, "logging.log_interval": 1, "eval.eval_interval": 0,
        "eval.sample_tokens": 0, "mixed_precision.dtype": "bf16" if kind == "bf16" else "fp32",
        "debug.cuda_tf32": "true" if kind == "tf32" else "false",
    }
    cmd = [binary, "train", "--config", "configs/gpt2-124m.yaml"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    env = dict(os.environ, MS_PROFILE_OPS="1" if profile else "0")
    rc, wall = run(cmd, os.path.join(out, label + ".log"), seconds, env=env)
    its, losses = [], []
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            for line in f:
                j = json.loads(line)
                if "iteration-time" in j:
                    its.append(j["iteration-time"] * 1e3)
                    losses.append(j.get("lm loss"))
    except OSError:
        pass
    timed = its[3:] if len(its) > 3 else its[1:]
    return {"name": "mindspeed-train (run.backend: cuda)", "kind": kind, "precision": OURS_PRECISION[kind], "rc": rc,
            "wall_s": round(wall, 1), "steps": len(its), "timed_steps": len(timed),
            "ms_per_step": statistics.median(timed) if timed else None,
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
            "note": "" if rc == 0 else f"exit {rc} after {len(its)} steps (see {label}.log)", "log": label + ".log"}


def torch_peer(python, out, batch, kind, seconds, compiled=True):
    label = f"torch-{kind}-{'compile' if compiled else 'eager'}"
    cmd = [python, "bench/torch_gpt2_bench.py", "--device", "cuda", "--dtype", kind, "--seq", str(T),
           "--positions", str(T), "--batch", str(batch), "--steps", "50", "--warmup", "3", "--threads", "8",
           "--max-seconds", str(max(seconds - 15, 5))]
    if compiled:
        cmd.append("--compile")
    rc, wall = run(cmd, os.path.join(out, label + ".log"), seconds)
    result = {}
    try:
        with open(os.path.join(out, label + ".log")) as f:
            lines = [line for line in f if line.startswith("{")]
        result = json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        pass
    ms = result.get("median_ms_per_step")
    how = "torch.compile" if compiled else "eager"
    return {"name": f"PyTorch {result.get('torch', '')} {how} + SDPA".replace("  ", " "), "kind": kind,
            "precision": PRECISION[kind], "rc": rc, "wall_s": round(wall, 1), "timed_steps": result.get("steps", 0),
            "ms_per_step": ms, "note": "" if rc == 0 and ms else f"exit {rc}, no timed step (see {label}.log)",
            "log": label + ".log"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="build-gpu/mindspeed-train")
    ap.add_argument("--out", default="gpt2-bench-out")
    ap.add_argument("--budget", type=float, default=200, help="seconds for all runs together")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--python", default=sys.executable, help="the Python with PyTorch for the peer")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    deadline = time.time() + a.budget
    left = lambda: deadline - time.time()  # noqa: E731

    dev = device_name()
    peak = find_peak(dev)
    # In priority order: the bf16 pair (the headline ratio), then fp32, then TF32 (the pair squeezed when time runs
    # short). Each run gets its weight's share of what is left (a torch.compile run costs about twice ours); a run
    # whose share is under 20 s gets all that is left, or is skipped when that is under 20 s too.
    jobs = [("ours", "bf16"), ("torch", "bf16"), ("ours", "fp32"), ("torch", "fp32"), ("ours", "tf32"),
            ("torch", "tf32")]
    weight = {"ours": 1.0, "torch": 2.0}
    ours_cap = {"bf16": 0.15, "fp32": 0.2, "tf32": 0.12}  # of --budget: 20 steps take ~5 s, start-up the rest
    # the op profile's run (after the table: it measures no speed) keeps 40 s of a budget of 150 s or more
    reserve = 40 if a.budget >= 150 else 0
    left_jobs = lambda: left() - reserve  # noqa: E731
    done = {}
    for i, (who, kind) in enumerate(jobs):
        share = left_jobs() * weight[who] / sum(weight[w] for w, _ in jobs[i:])
        if share < 20 and left_jobs() >= 20:
            share = left_jobs()
        if share < 20:
            done[(who, kind)] = {"name": "mindspeed-train (run.backend: cuda)" if who == "ours" else "PyTorch",
                                 "kind": kind, "precision": (OURS_PRECISION if who == "ours" else PRECISION)[kind],
                                 "ms_per_step": None, "note": "no time left"}
            continue
        if who == "ours":
            seconds = min(share, max(ours_cap[kind] * a.budget, 25))  # start-up alone takes ~10 s
            done[(who, kind)] = mindspeed(a.binary, a.out, a.batch, a.steps, seconds, kind)
            continue
        row = torch_peer(a.python, a.out, a.batch, kind, share)
        if row["ms_per_step"] is None and left_jobs() > 25:  # compile failed or was too slow: eager, if time allows
            eager = torch_peer(a.python, a.out, a.batch, kind, min(left_jobs(), 40), compiled=False)
            eager["note"] = f"torch.compile: {row['note']}; eager instead"
            row = eager if eager["ms_per_step"] else row
        done[(who, kind)] = row
    # the table: ours fp32, TF32, bf16, then PyTorch's
    rows = [done[("ours", k)] for k in ("fp32", "tf32", "bf16")] + [done[("torch", k)] for k in ("bf16", "fp32",
                                                                                                  "tf32")]

    fpt = flops_per_token()
    tokens = a.batch * T
    for r in rows:
        ms = r.get("ms_per_step")
        r["tokens_per_s"] = tokens / (ms / 1e3) if ms else None
        # against the peak of the precision the run computes in, and against the bf16 tensor-core peak
        r["mfu_own"] = (fpt * r["tokens_per_s"] / peak[r["kind"]]) if (ms and peak) else None
        r["mfu_bf16"] = (fpt * r["tokens_per_s"] / peak["bf16"]) if (ms and peak) else None

    fmt = lambda v, f: ("n/a" if v is None else f.format(v))  # noqa: E731
    lines = [
        f"GPT-2 124M (L{L} C{C} NH{NH} T{T} Vp{VP}), micro-batch {a.batch} = {tokens} tokens/step, one GPU: "
        f"{dev or 'unknown (nvidia-smi gave no name)'}",
        f"model FLOPs/token {fpt / 1e9:.3f} GFLOP (Megatron's formula); peaks (dense): "
        + (f"fp32 (no tensor cores) {peak['fp32'] / 1e12:.1f}, TF32 {peak['tf32'] / 1e12:.1f}, "
           f"bf16 {peak['bf16'] / 1e12:.1f} TFLOP/s ({peak['device']} in the table)"
           if peak else "UNKNOWN DEVICE: not in the peak table of bench/gpu/gpt2_bench.py, MFU n/a"),
        "MFU (own precision's peak) divides by the dense peak of what the run computes in (its precision column)",
        "",
        "| run | precision | ms/step | tokens/s | MFU (own precision's peak) | MFU vs bf16 peak | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['name']} | {r['precision']} | {fmt(r.get('ms_per_step'), '{:.1f}')} | "
                     f"{fmt(r.get('tokens_per_s'), '{:.0f}')} | {fmt(r.get('mfu_own'), '{:.1%}')} | "
                     f"{fmt(r.get('mfu_bf16'), '{:.2%}')} | {r.get('note', '')} |")
    ms_row = rows[0]
    ours = {r["kind"]: r for r in rows if r["name"].startswith("mindspeed")}
    torch_rows = {r["kind"]: r for r in rows if not r["name"].startswith("mindspeed")}

    def ratio(kind):
        o, t = ours.get(kind, {}).get("tokens_per_s"), torch_rows.get(kind, {}).get("tokens_per_s")
        how = "eager" if " eager " in torch_rows.get(kind, {}).get("name", "") else "torch.compile"
        return (f"ours({kind})/{how}({kind}) = " + (f"{o / t:.3f}" if o and t else "n/a")), (o / t if o and t else None)

    (bf16_line, bf16_ratio), (fp32_line, fp32_ratio) = ratio("bf16"), ratio("fp32")
    lines.append(f"\nsummary: tokens/s {bf16_line}, {fp32_line}")
    for r in ours.values():
        if r.get("loss_first") is not None:
            lines.append(f"mindspeed-train {r['kind']} lm loss {r['loss_first']:.4f} -> {r['loss_last']:.4f} over "
                         f"{r['steps']} steps (synthetic data; a sanity check, not a result)")
    # Where ours spends a bf16 step: a short run with MS_PROFILE_OPS=1 (last: it measures no speed), if time is left
    if left() > 30:
        prof = mindspeed(a.binary, a.out, a.batch, 6, min(left(), 60), "bf16", profile=True)
        path = os.path.join(a.out, "mindspeed-train-bf16-profile-run", "op_profile_rank0.txt")
        if os.path.exists(path):
            with open(path) as f:
                lines += ["", f"mindspeed-train bf16, micro-batch {a.batch}: where a step goes (MS_PROFILE_OPS=1)", "```"]
                lines += [line.rstrip("\n") for line in f] + ["```"]
        else:
            lines.append(f"\n(no op profile: {prof.get('note') or 'op_profile_rank0.txt missing'})")
    if not peak:
        lines.append("\n!!! UNKNOWN DEVICE: add it to PEAKS (and engine/train/device_peak.cpp) to get MFU !!!")
    table = "\n".join(lines)
    print(table, flush=True)
    with open(os.path.join(a.out, "gpt2_bench.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(a.out, "gpt2_bench.json"), "w") as f:
        json.dump({"device": dev, "peak": peak, "flops_per_token": fpt, "tokens_per_step": tokens, "rows": rows,
                   "ratio_bf16": bf16_ratio, "ratio_fp32": fp32_ratio}, f, indent=1, default=str)
    return 0 if ms_row.get("ms_per_step") and ours.get("bf16", {}).get("ms_per_step") else 1


if __name__ == "__main__":
    sys.exit(main())
