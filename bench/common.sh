# common.sh: what the bench scripts comparing mindspeed-train with PyTorch share (sourced, not run).

# The median ms/step of a mindspeed-train log's iterations after the first two (warm-up).
median_ms() {
  grep -o 'elapsed time per iteration (ms): [0-9.]*' "$1" | awk '{print $NF}' | tail -n +3 |
    sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'
}

# The parameter count a mindspeed-train log reports.
parameters() { grep -o 'parameters [0-9]*' "$1" | head -n1 | awk '{print $2}'; }

# $1, $2: the two systems' parameter counts; a comparison of different models is refused.
same_model() {
  [ "$1" = "$2" ] || { echo "bench: the models differ: mindspeed-train has $1 parameters, PyTorch $2" >&2; exit 1; }
}

# The median ms/step and parameter count of the last JSON line torch_gpt2_bench.py printed in log $1 (python $2).
torch_result() {
  grep '^{' "$1" | tail -n1 | "$2" -c 'import json,sys; r=json.load(sys.stdin); print(r["median_ms_per_step"], r["parameters"])'
}
