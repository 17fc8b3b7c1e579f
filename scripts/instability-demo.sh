#!/usr/bin/env bash
# A real instability, reproduced small (Wortsman et al. 2023, "Small-scale proxies for large-scale
# Transformer training instabilities"): a 2-layer, 128-wide GPT on the default corpus warmed up
# to LR 0.1. Its attention logits grow without bound and the loss climbs back from its lowest
# level to the unigram plateau. Three runs of the same data and seed:
#   unguarded   --guard off
#   guarded     --guard act with a 2% divergence threshold: rolls back, skips, cuts the LR
#   mitigated   --qk-layernorm --z-loss 1e-4, --guard off
# and a summary table of the curves' key numbers. About 1-2 minutes on 2 cores.
# Usage: scripts/instability-demo.sh [WORKDIR]   (default: a temp dir, removed at the end)
set -euo pipefail
cd "$(dirname "$0")/.."
KEEL=${KEEL:-build/keel}
WORK=${1:-$(mktemp -d)}
[ -n "${1:-}" ] || trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK"
COMMON=(train --num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64
  --micro-batch-size 8 --global-batch-size 16 --train-iters 500 --lr 1e-1 --min-lr 1e-1
  --lr-decay-style constant --lr-warmup-iters 250 --log-interval 10 --eval-interval 1000
  --eval-iters 0 --sample-tokens 0 --threads 2 --save-interval 25 --keep-last-checkpoints 0)

run() {  # name, extra flags...
  local name=$1; shift
  rm -rf "$WORK/$name"
  set +e
  "$KEEL" "${COMMON[@]}" --save "$WORK/$name" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  set -e
  echo "$rc" > "$WORK/$name.rc"
}

run unguarded --guard off
run guarded --guard act --guard-divergence-rel 0.02
run mitigated --guard off --qk-layernorm --z-loss 1e-4
# The attention logits of the unguarded and mitigated runs, read by an observing guard.
run unguarded-observed --guard observe --guard-divergence-rel 0.02
run mitigated-observed --guard observe --guard-divergence-rel 0.02 --qk-layernorm --z-loss 1e-4

summary() {  # name, signals-log
  local name=$1 sig=$2
  awk -v name="$name" -v rc="$(cat "$WORK/$name.rc")" '
    /^ iteration / {
      for (i = 1; i <= NF; i++) if ($i == "loss:" && $(i-1) == "lm") loss = $(i+1) + 0
      it = $2; sub("/.*", "", it); it += 0
      if (loss == loss) { last[it] = loss; n++ }
      if (min == "" || loss < min) { min = loss; minit = it }
    }
    END {
      s = 0; k = 0
      for (i = 460; i <= 500; i += 10) if (i in last) { s += last[i]; k++ }
      printf "%-10s | exit %s | lowest %.3f at %4d | final (mean of 460..500) %.3f", name, rc, min, minit, (k ? s / k : -1)
    }' "$WORK/$name.log"
  awk '/guard signals/ { for (i = 1; i <= NF; i++) if ($i == "logit:") { v = $(i+1) + 0; if (v > m) m = v; last = v } }
       END { if (m) printf " | max attention logit: peak %.1f, final %.1f", m, last }' "$WORK/$sig.log"
  if [ -f "$WORK/$name/events.jsonl" ]; then
    printf " | rollbacks %s" "$(grep -c '"event":"rollback"' "$WORK/$name/events.jsonl" || true)"
    local lr
    lr=$(grep '"event":"rollback"' "$WORK/$name/events.jsonl" | tail -1 | sed -n 's/.*"lr_scale":\([0-9.e-]*\).*/\1/p')
    [ -n "$lr" ] && printf ", final LR scale %s" "$lr"
  fi
  echo
}

echo "instability demo: ${COMMON[*]}"
summary unguarded unguarded-observed
summary guarded guarded
summary mitigated mitigated-observed
echo "chronicle of the guarded run:"
sed 's/^/  /' "$WORK/guarded/CHRONICLE.md"
