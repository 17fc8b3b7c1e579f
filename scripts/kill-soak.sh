#!/usr/bin/env bash
# Kill-9 soak: trains a small model, SIGKILLs it at random times (and at random filesystem
# operations inside saves via KEEL_FAULT_INJECTION), resumes with the same command until the run
# completes, and checks the final state fingerprint and every iteration line (timing fields aside)
# against an uninterrupted run. The CI suite runs a handful of fixed kill points
# (tests/cli/resume_cli_test.cc); this script runs as many random ones as you like.
#
#
#   scripts/kill-soak.sh [ROUNDS=20] [KEEL=build/keel] [MODE=sync|async|async2|local|local2]
#
# MODE async: the interrupted runs save with --async-save every 2 iterations, and the crashes
# land on filesystem operations inside the saves' temporary directories, which the background
# writer performs while the loop trains on (the reference run saves synchronously, so this also
# checks that both write the same bits). MODE async2: the same under `mpirun -np 2` (crashes
# only: each rank dies at its own operation, and mpirun takes the other rank down).
# MODE local: the interrupted runs also save local checkpoints (--non-persistent-save-interval 2
# to a node-local directory of the run's) beside persistent ones every 10 iterations, and the
# crashes land on filesystem operations inside the local tier (its pieces, replicas, the
# assembly of a resume); kill -9 at random times too. MODE local2: the same under `mpirun -np 2`
# (crashes only), where every piece is also held by the other rank.
set -uo pipefail
ROUNDS=${1:-20}
KEEL=${2:-build/keel}
MODE=${3:-sync}
WORK=$(mktemp -d /tmp/keel-soak.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
ARGS=(train --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64
      --micro-batch-size 2 --global-batch-size 8 --train-iters 60 --lr-warmup-iters 5
      --log-interval 1 --eval-interval 20 --eval-iters 1 --sample-tokens 0 --threads 1
      --save-interval 5)
RUN_ARGS=()
LAUNCH=()
CRASH_PATH=""
CRASH_SPAN=150
case "$MODE" in
  sync) ;;
  async|async2)
    RUN_ARGS=(--async-save --save-interval 2)
    CRASH_PATH=":.tmp.iter_"
    CRASH_SPAN=600
    if [[ $MODE == async2 ]]; then
      LAUNCH=(timeout 300 mpirun --allow-run-as-root --oversubscribe
              --mca btl_vader_single_copy_mechanism none -np 2)
    fi
    ;;
  local|local2)
    RUN_ARGS=(--save-interval 10 --non-persistent-save-interval 2
              --non-persistent-local-ckpt-dir "$WORK/local")
    CRASH_PATH=":keel-local-"
    CRASH_SPAN=400
    if [[ $MODE == local2 ]]; then
      LAUNCH=(timeout 300 mpirun --allow-run-as-root --oversubscribe
              --mca btl_vader_single_copy_mechanism none -np 2)
    fi
    ;;
  *) echo "MODE must be sync, async, async2, local or local2" >&2; exit 2 ;;
esac

untimed() {  # iteration/validation lines without timing fields, last occurrence per iteration
  cat "$@" | grep -E '^ (iteration|validation)' | sed -E 's/elapsed time per iteration \(ms\): [0-9.]+ \|//; s/samples per second: [0-9.]+ \|//; s/TFLOPs: [0-9.]+ \|//' |
    awk '{ key = ($1 == "iteration") ? "it " $2 : "val " $5; last[key] = $0; order[key] = NR }
         END { for (k in last) print order[k] "\t" k "\t" last[k] }' | sort -t$'\t' -k2,2 | cut -f2-
}

"${LAUNCH[@]}" "$KEEL" "${ARGS[@]}" --save "$WORK/ref" > "$WORK/ref.log" 2>&1
REF_FP=$(grep -o 'state fingerprint: [0-9a-f]*' "$WORK/ref.log" | tail -1)
untimed "$WORK/ref.log" > "$WORK/ref.lines"

total=0
for round in $(seq 1 "$ROUNDS"); do
  rm -rf "$WORK/run" "$WORK/local" "$WORK"/run.*.log
  kills=0
  for attempt in $(seq 1 40); do
    log="$WORK/run.$attempt.log"
    if (( RANDOM % 2 )) || [[ $MODE == async2 || $MODE == local2 ]]; then
      # A crash at a random filesystem operation (most of them happen inside saves; in the async
      # modes all of them, on the background writer's thread; in the local modes all of them
      # inside the local tier).
      KEEL_FAULT_INJECTION="crash-at=$(( RANDOM % CRASH_SPAN + 1 ))$CRASH_PATH" "${LAUNCH[@]}" "$KEEL" "${ARGS[@]}" "${RUN_ARGS[@]}" --save "$WORK/run" > "$log" 2>&1 && rc=0 || rc=$?
    else
      "$KEEL" "${ARGS[@]}" "${RUN_ARGS[@]}" --save "$WORK/run" > "$log" 2>&1 &
      pid=$!
      sleep "0.$(( RANDOM % 9 + 1 ))"
      kill -9 "$pid" 2>/dev/null || true
      wait "$pid" && rc=0 || rc=$?
    fi
    if [[ $rc == 0 ]] && grep -q 'training finished\|already completes' "$log"; then break; fi
    kills=$((kills + 1))
  done
  "${LAUNCH[@]}" "$KEEL" "${ARGS[@]}" "${RUN_ARGS[@]}" --save "$WORK/run" > "$WORK/run.final.log" 2>&1
  FP=$(grep -o 'state fingerprint: [0-9a-f]*' "$WORK/run.final.log" | tail -1)
  untimed $(ls -tr "$WORK"/run.*.log) > "$WORK/run.lines"
  if [[ "$FP" != "$REF_FP" ]] || ! diff -q "$WORK/ref.lines" "$WORK/run.lines" > /dev/null; then
    echo "round $round: MISMATCH after $kills kills ($FP vs $REF_FP)"
    diff "$WORK/ref.lines" "$WORK/run.lines" | head -20
    exit 1
  fi
  total=$((total + kills))
  locals=$(cat "$WORK"/run.*.log | grep -c 'resuming from the local tier' || true)
  echo "round $round: $kills kills ($locals resumes from the local tier), resumed to the same bits ($FP)"
done
echo "all $ROUNDS rounds ($total kill points, mode $MODE) bit-identical to the uninterrupted run"
