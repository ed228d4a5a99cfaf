#!/usr/bin/env python3
"""torch_gpt2_bench.py: the PyTorch peer for bench/cpu_gpt2_124m.sh (CPU) and bench/gpu/gpt2_bench.py (GPU).

GPT-2 (nanoGPT-style module: pre-LN blocks, GELU tanh, tied head, padded vocab) trained with torch.optim.AdamW
on random tokens. Prints one line per step "step N ms M" and a final JSON line with the median ms/step of the
timed steps.
  CPU (the default): fp32 on the given number of threads. With Debian's /usr/bin/python3 (python3-torch 1.13):
       foreach AdamW (the fastest CPU path in 1.13) and masked-matmul attention. With PyTorch 2.x (the bench-only
       virtualenv of bench/cpu_gpt2_124m.sh, MS_BENCH_PYTHON): F.scaled_dot_product_attention (causal) and fused
       AdamW (on the CPU since 2.4). --attention / --adamw force either path; the JSON line says which ran.
  GPU (--device cuda): F.scaled_dot_product_attention (causal), fused AdamW, optionally torch.compile (--compile),
       TF32 matmuls (--dtype tf32) or bf16 autocast (--dtype bf16); fp32 is strict fp32 (TF32 off). Each step
       ends with torch.cuda.synchronize(). --max-seconds stops after the step that crosses it (torch.compile
       happens in the first steps, so the warm-up steps absorb it); the JSON line then says how many steps ran.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        if mask is None:  # torch >= 2.0 (--attention): the fused causal kernel
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(mask[:, :, :T, :T] == 0, float("-inf")).softmax(dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, NH, T, Vp, sdpa=False):
        super().__init__()
        self.sdpa = sdpa
        self.wte = nn.Embedding(Vp, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
        for m in self.modules():  # GPT-2's init (N(0, 0.02), zero biases), so the loss starts near ln(V)
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets, V):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x, None if self.sdpa else self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()
        logits[..., V:] = float("-inf")
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--positions", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--padded-vocab", type=int, default=50304)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["fp32", "tf32", "bf16"], default="fp32",
                    help="tf32: fp32 with TF32 matmuls (GPU); bf16: autocast, fp32 master weights")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (GPU)")
    ap.add_argument("--max-seconds", type=float, default=0, help="stop after the step that crosses this (0: never)")
    ap.add_argument("--attention", choices=["auto", "sdpa", "masked"], default="auto",
                    help="auto: F.scaled_dot_product_attention where this torch has it (>= 2.0), else masked matmuls")
    ap.add_argument("--ddp", action="store_true",
                    help="data parallel over the processes torchrun starts (DistributedDataParallel, gloo on the CPU); "
                         "each rank its own micro-batch, rank 0 prints the JSON line")
    ap.add_argument("--adamw", choices=["auto", "fused", "foreach"], default="auto",
                    help="auto: fused on the GPU and on the CPU from torch 2.4, else foreach")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rank = 0
    if a.ddp:
        import torch.distributed as dist
        dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
        rank = dist.get_rank()
    torch.manual_seed(rank)
    cuda = a.device == "cuda"
    if cuda:  # strict fp32 matmuls, as mindspeed-train's by default, unless --dtype tf32 (debug.cuda_tf32: true there)
        torch.backends.cuda.matmul.allow_tf32 = a.dtype == "tf32"
        torch.backends.cudnn.allow_tf32 = a.dtype == "tf32"
    has_sdpa = hasattr(F, "scaled_dot_product_attention")  # torch >= 2.0
    sdpa = a.attention == "sdpa" or (a.attention == "auto" and has_sdpa)
    torch_major_minor = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    adamw = a.adamw if a.adamw != "auto" else ("fused" if cuda or torch_major_minor >= (2, 4) else "foreach")
    model = GPT(a.layers, a.hidden, a.heads, a.positions, a.padded_vocab, sdpa=sdpa).to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            **({"fused": True} if adamw == "fused" else {"foreach": True}))
    step_model = torch.compile(model) if a.compile else model
    if a.ddp:
        step_model = torch.nn.parallel.DistributedDataParallel(step_model)
    x = torch.randint(0, a.vocab, (a.batch, a.seq), device=a.device)
    y = torch.randint(0, a.vocab, (a.batch, a.seq), device=a.device)
    times = []
    start = time.perf_counter()
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=a.device, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            loss = step_model(x, y, a.vocab)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) * 1e3
        if rank == 0:
            print(f"step {step} ms {dt:.1f} loss {loss.item():.4f}", flush=True)
        if step >= a.warmup:
            times.append(dt)
        if a.max_seconds > 0 and time.perf_counter() - start > a.max_seconds:
            break
    result = {"median_ms_per_step": statistics.median(times) if times else None, "steps": len(times),
              "device": torch.cuda.get_device_name() if cuda else "cpu", "dtype": a.dtype, "compile": a.compile,
              "sdpa": sdpa, "adamw": adamw, "threads": torch.get_num_threads(), "torch": torch.__version__,
              "ddp": a.ddp, "parameters": sum(p.numel() for p in model.parameters())}
    if rank == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
