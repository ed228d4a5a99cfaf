#!/usr/bin/env bash
# onebit_adam.sh: 1-bit Adam against AdamW on real text, same steps and learning rate, dp 4 (issue: the optimizer at
# scale). A text file (default: none; pass one) goes through `preprocess` (byte tokenizer), then a small GPT trains
# four times: AdamW; onebit_adam; onebit_adam with zero_stage 1; onebit_adam at pp 2 (dp 4 on 8 ranks). Prints the
# final validation loss of each and its ratio to AdamW's, the data-parallel bytes per step after the warm-up, and
# writes every curve into one SVG picture.
#
#   bench/onebit_adam.sh BUILD_DIR TEXT_FILE [ITERS] [OUT_DIR]
#
# The model: 4 layers, hidden 256, 4 heads, sequence 128, vocabulary 257 (bytes + end of document): 3.2M parameters,
# sized so that four runs of ITERS (default 1000) steps fit a 2-core machine in about half an hour.
set -euo pipefail
build=${1:?usage: bench/onebit_adam.sh BUILD_DIR TEXT_FILE [ITERS] [OUT_DIR]}
text=${2:?usage: bench/onebit_adam.sh BUILD_DIR TEXT_FILE [ITERS] [OUT_DIR]}
iters=${3:-1000}
out=${4:-runs/bench-onebit}
bin="$build/mindspeed-train"
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
mpi=(mpirun --oversubscribe --allow-run-as-root)

"$bin" preprocess --input "$text" --output-prefix "$out/data" > "$out/preprocess.log" 2>&1

freeze=$((iters * 15 / 100))  # DeepSpeed's tutorials freeze after 15-25% of the run
common=(--config "$here/../configs/demo.yaml"
  --set model.num_layers=4 --set model.hidden_size=256 --set model.num_attention_heads=4
  --set model.seq_length=128 --set model.vocab_size=0
  --set data.source=megatron --set data.data_path="$out/data_text_document" --set data.split=949,50,1
  --set training.micro_batch_size=4 --set training.global_batch_size=16 --set training.train_iters="$iters"
  --set optimizer.lr=1e-3 --set optimizer.min_lr=1e-4 --set lr_schedule.lr_warmup_iters=$((iters / 20))
  --set logging.log_interval=10 --set eval.eval_interval=$((iters / 10)) --set eval.eval_iters=8
  --set eval.sample_tokens=0)
onebit=(--set optimizer.type=onebit_adam --set optimizer.freeze_step="$freeze")

run() {  # name ranks flags...
  local name=$1 ranks=$2
  shift 2
  rm -rf "${out:?}/$name"
  "${mpi[@]}" -n "$ranks" "$bin" train "${common[@]}" --set run.output_dir="$out/$name" "$@" \
    > "$out/$name.log" 2>&1
}
run adamw 4
run onebit 4 "${onebit[@]}"
run onebit_zero1 4 "${onebit[@]}" --set parallel.zero_stage=1
run onebit_pp2 8 "${onebit[@]}" --set parallel.pipeline_model_parallel_size=2

python3 "$here/onebit_adam_report.py" "$out" "$freeze" adamw onebit onebit_zero1 onebit_pp2
