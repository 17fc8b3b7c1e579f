#!/usr/bin/env bash
# Data parallel on one machine: the same model and global batch trained by 1 process x 2 threads
# and by 2 MPI processes x 1 thread, alternated ROUNDS times (these machines are noisy); prints the
# median tokens/s of each, their ratio, and the 2-process run's communication line (bytes per
# iteration against the 2(N-1)/N lower bound, reduction time, overlap with backward).
#
#   scripts/bench-dp.sh [ROUNDS]        (default 3; build/keel must exist)
#
# The model is `keel bench`'s "small" one (6 x 512, sequence 256) on the default corpus's
# SentencePiece vocabulary: 21.3M parameters. Global batch 16, micro-batch 8.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
keel=build/keel
iters=14
args=(train --num-layers 6 --hidden-size 512 --num-attention-heads 8 --seq-length 256
  --tokenizer sentencepiece --micro-batch-size 8 --global-batch-size 16 --train-iters $iters
  --lr-warmup-iters 2 --log-interval 1 --eval-interval 1000 --eval-iters 0 --sample-tokens 0
  --guard off)
mpirun=(timeout 600 mpirun --allow-run-as-root --oversubscribe --bind-to none
  --mca btl_vader_single_copy_mechanism none)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Median ms per iteration over iterations 5..end (the first ones warm caches and pools).
median_ms() {
  grep -o 'iteration *[0-9]*/ *[0-9]* .*elapsed time per iteration (ms): [0-9.]*' "$1" |
    awk -F'[ /]+' '{print}' | sed -n "5,${iters}p" |
    grep -o '(ms): [0-9.]*' | awk '{print $2}' | sort -n |
    awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'
}

one=() two=()
for ((r = 1; r <= rounds; r++)); do
  "$keel" "${args[@]}" --threads 2 >"$tmp/one.$r.log" 2>&1
  one+=("$(median_ms "$tmp/one.$r.log")")
  "${mpirun[@]}" -np 2 "$keel" "${args[@]}" --threads 1 >"$tmp/two.$r.log" 2>&1
  two+=("$(median_ms "$tmp/two.$r.log")")
  echo "round $r: 1x2 ${one[-1]} ms/iteration, 2x1 ${two[-1]} ms/iteration"
done
med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
m1=$(med "${one[@]}")
m2=$(med "${two[@]}")
tokens=$((16 * 256))
awk -v m1="$m1" -v m2="$m2" -v t="$tokens" 'BEGIN {
  printf "1 process x 2 threads: %.0f tokens/s (median %.1f ms/iteration)\n", t / m1 * 1000, m1
  printf "2 processes x 1 thread: %.0f tokens/s (median %.1f ms/iteration)\n", t / m2 * 1000, m2
  printf "2x1 / 1x2 tokens/s: %.3f\n", m1 / m2 }'
grep -h "parameters:" "$tmp/one.1.log" | head -1
grep -h "data parallel: this rank sent" "$tmp"/two.*.log
