#!/usr/bin/env bash
# The cost of keeping a run out of limbo: the same 2-rank data-parallel run (2 MPI processes x 1
# thread) with the watchdog, the straggler detector and replica checks every 10 iterations (ten
# times the default rate), and with all three off, alternated ROUNDS times (these machines are
# noisy). Prints each pair's training time (the whole loop, so the checks are inside it) and the
# median of the paired ratios on/off.
#
#   scripts/bench-health.sh [ROUNDS]        (default 5; build/keel must exist)
#
# The model is `keel bench`'s "small" one (6 x 512, sequence 256): 21.3M parameters, global
# batch 16, micro-batch 8, 40 iterations per run. The in-step header on host collectives is
# always on (it travels inside collectives the loop makes anyway) and so is in both.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
keel=build/keel
args=(train --num-layers 6 --hidden-size 512 --num-attention-heads 8 --seq-length 256
  --tokenizer sentencepiece --micro-batch-size 8 --global-batch-size 16 --train-iters 40
  --lr-warmup-iters 2 --log-interval 10 --eval-interval 1000 --eval-iters 0 --sample-tokens 0
  --guard off --threads 1)
on=(--check-replicas-interval 10 --straggler-window 10)
off=(--distributed-timeout-minutes 0 --check-replicas-interval 0 --straggler-window 0)
mpirun=(timeout 600 mpirun --allow-run-as-root --oversubscribe --bind-to none
  --mca btl_vader_single_copy_mechanism none -np 2)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

secs() { grep -o 'training finished: iteration [0-9]* in [0-9.]* s' "$1" | awk '{print $(NF-1)}'; }

ratios=()
for ((r = 1; r <= rounds; r++)); do
  # Alternate which goes first, so a drift in the machine's speed does not favour one.
  if ((r % 2)); then order=(on off); else order=(off on); fi
  for which in "${order[@]}"; do
    if [[ $which == on ]]; then flags=("${on[@]}"); else flags=("${off[@]}"); fi
    "${mpirun[@]}" "$keel" "${args[@]}" "${flags[@]}" >"$tmp/$which.$r.log" 2>&1
  done
  a=$(secs "$tmp/on.$r.log")
  b=$(secs "$tmp/off.$r.log")
  ratios+=("$(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.4f", a / b}')")
  echo "round $r: checks on ${a} s, off ${b} s, on/off ${ratios[-1]}"
done
printf '%s\n' "${ratios[@]}" | sort -n |
  awk '{a[NR]=$1} END {m = (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2);
       printf "median on/off training time: %.4f (overhead %+.2f%%)\n", m, 100 * (m - 1)}'
grep -h "replica check at iteration" "$tmp"/on.1.log | head -1
