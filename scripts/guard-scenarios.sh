#!/usr/bin/env bash
# The guard's scenario benchmark (docs/benchmarks.md, "The guard against faults"): each fault
# scenario is trained three times on the same seed and data, with the test-only fault hooks of
# src/train/test_hooks.h (KEEL_TRAIN_FAULTS):
#   clean       no fault, --guard off
#   unguarded   the fault, --guard off
#   guarded     the fault, the guard at its defaults (act)
# and the clean runs of three model sizes are trained guarded (any event there is a false alarm).
# Per run: the loss at the end (mean lm loss of the last 20 iterations), its damage (that mean
# minus the clean run's), the waste (updates skipped, iterations whose data was skipped,
# iterations recomputed after rollbacks, wall seconds) and the events journaled. Prints a
# Markdown table (and writes it to WORKDIR/table.md).
#
#   scripts/guard-scenarios.sh [WORKDIR]   (default: a temp dir, removed at the end)
#   KEEL=build/keel SCENARIOS="poison-4 nan-3" scripts/guard-scenarios.sh   (a subset)
#   GUARD_FLAGS="--guard-max-skips 20" scripts/guard-scenarios.sh    (a policy against the defaults)
set -euo pipefail
cd "$(dirname "$0")/.."
KEEL=${KEEL:-$PWD/build/keel}
WORK=${1:-$(mktemp -d)}
[ -n "${1:-}" ] || trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK"

# The docs' small model (docs/guard.md) at its LR, 200 iterations, a checkpoint every 20.
SMALL="--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32
  --micro-batch-size 2 --global-batch-size 8 --lr-warmup-iters 3 --train-iters 200 --lr 5e-3
  --save-interval 20"
MEDIUM="--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 64
  --micro-batch-size 4 --global-batch-size 8 --lr-warmup-iters 10 --train-iters 200 --lr 3e-3
  --save-interval 20"
LARGE="--num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 64
  --micro-batch-size 4 --global-batch-size 8 --lr-warmup-iters 20 --train-iters 200 --lr 2e-3
  --save-interval 20"
# scripts/instability-demo.sh's model: warmed up to LR 0.1, its attention logits grow without
# bound and the loss climbs back from its lowest level.
DEMO="--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64
  --micro-batch-size 8 --global-batch-size 16 --train-iters 500 --lr 1e-1 --min-lr 1e-1
  --lr-decay-style constant --lr-warmup-iters 250 --save-interval 25"
# A slow divergence (issue 36): the docs' small model at a constant LR for 1800 iterations; from
# iteration 1001 its LR is raised 1.3x every 50 iterations (to 67x by 1800), and the loss, which
# had stopped falling, climbs a few percent over hundreds of iterations without a spike.
SLOWDIV="--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32
  --micro-batch-size 2 --global-batch-size 8 --lr-warmup-iters 3 --train-iters 1800 --lr 5e-3
  --lr-decay-style constant --save-interval 50"
SLOWDIV_FAULTS=$(python3 -c 'print(",".join(f"lr={1001 + 50 * i}-{1050 + 50 * i}*{1.3 ** (i + 1):.2f}" for i in range(16)))')
COMMON="--log-interval 10 --eval-interval 1000 --eval-iters 0 --sample-tokens 0 --threads 1
  --keep-last-checkpoints 0"

# name | model | KEEL_TRAIN_FAULTS | what it stands for | the guarded run's own flags
SCENARIO_TABLE="
poison-1|SMALL|poison=101-101|one batch of random tokens
poison-4|SMALL|poison=101-104|4 bad batches
poison-12|SMALL|poison=101-112|12 bad batches
poison-40|SMALL|poison=101-140|40 bad batches
poison-12-lr3|SMALL|poison=101-112,lr=101-112*3|12 bad batches at 3x the LR
poison-12-lr10|SMALL|poison=101-112,lr=101-112*10|12 bad batches at 10x the LR (no recovery by itself)
nan-1|SMALL|nan-grad=101-101|a NaN in one iteration's gradients
nan-3|SMALL|nan-grad=101-103|NaN gradients 3 iterations in a row
lr10-late|SMALL|lr=81-200*10|the LR 10x from iteration 81 on (a sustained LR error)
lr0.1-demo|DEMO||the attention-logit instability of scripts/instability-demo.sh
slow-div|SLOWDIV|$SLOWDIV_FAULTS|the LR raised 1.3x every 50 iterations from 1001 (a slow divergence)|--guard-divergence act
slow-div-notify|SLOWDIV|$SLOWDIV_FAULTS|the same, --guard-divergence notify (the default)|
slow-div-z3|SLOWDIV|$SLOWDIV_FAULTS|the same, act, the trend test at z 3 (4.7 a value an iteration)|--guard-divergence act --guard-trend-z 3
clean-small|SMALL||no fault: false alarms
clean-medium|MEDIUM||no fault: false alarms
clean-large|LARGE||no fault: false alarms
"

run() {  # dir, model flags, faults, guard mode[, the guarded run's own flags]
  local dir=$1 model=$2 faults=$3 guard=$4 own=${5:-}
  rm -rf "$dir"
  local t0 t1 rc=0
  t0=$(date +%s%N)
  # shellcheck disable=SC2086
  local extra=""
  [ "$guard" = off ] || extra="${GUARD_FLAGS:-} $own"
  # shellcheck disable=SC2086
  KEEL_TRAIN_FAULTS="$faults" "$KEEL" train $model $COMMON --guard "$guard" $extra --save "$dir" \
    >"$dir.log" 2>&1 || rc=$?
  t1=$(date +%s%N)
  echo "$rc $(((t1 - t0) / 1000000))" >"$dir.run"  # exit code, wall milliseconds
}

: >"$WORK/scenarios.txt"
want=" ${SCENARIOS:-} "
while IFS='|' read -r name model faults what own; do
  [ -n "$name" ] || continue
  [ "$want" = "  " ] || [[ "$want" == *" $name "* ]] || continue
  flags=${!model}
  # The demo's instability is the model's own: it has no clean counterpart.
  clean="$WORK/clean-$model"
  [ "$model" = DEMO ] || [ -f "$clean.run" ] || run "$clean" "$flags" "" off
  if [ -n "$faults" ] || [ "$model" = DEMO ]; then
    run "$WORK/$name-unguarded" "$flags" "$faults" off
  fi
  run "$WORK/$name-guarded" "$flags" "$faults" act "$own"
  echo "$name|$model|$faults|$what" >>"$WORK/scenarios.txt"
  echo "guard-scenarios: $name done" >&2
done <<<"$SCENARIO_TABLE"

python3 - "$WORK" <<'PY' | tee "$WORK/table.md"
import json, math, os, sys
work = sys.argv[1]

def load(d):
    """The run's metrics (the timeline as it ended: rollbacks rewind the file) and events."""
    rc, wall = open(d + ".run").read().split()
    rows = {}
    if os.path.exists(d + "/metrics.jsonl"):
        for line in open(d + "/metrics.jsonl"):
            r = json.loads(line)
            if r.get("kind") == "train":
                rows[r["iteration"]] = r
    events = []
    if os.path.exists(d + "/events.jsonl"):
        events = [json.loads(l) for l in open(d + "/events.jsonl") if l.strip()]
    return int(rc), float(wall) / 1000, [rows[k] for k in sorted(rows)], events

def end_loss(rows):
    xs = [r["lm_loss"] for r in rows
          if not r.get("data_skipped") and isinstance(r.get("lm_loss"), (int, float))]
    xs = xs[-20:]
    if not xs or any(not math.isfinite(x) for x in xs):
        return float("nan")
    return sum(xs) / len(xs)

def waste(rows, events):
    skipped = sum(1 for r in rows if r.get("skipped") and not r.get("data_skipped"))
    data_skipped = sum(1 for r in rows if r.get("data_skipped"))
    recomputed = sum(e["iteration"] - e["to_iteration"] for e in events
                     if e.get("event") == "rollback")
    return skipped, data_skipped, recomputed

def journal(events):
    counts = {}
    for e in events:
        k = e.get("event", "?")
        if k in ("started", "resumed", "finished", "run_start", "run_end"):
            continue
        counts[k] = counts.get(k, 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"

def fmt(x):
    return "NaN" if not math.isfinite(x) else f"{x:.3f}"

def gap(x, ref):
    return "NaN" if not (math.isfinite(x) and math.isfinite(ref)) else f"{x - ref:+.3f}"

print("| scenario | fault | clean | unguarded (damage) | guarded (damage) | guarded waste: "
      "updates skipped / data skipped / recomputed | wall s (unguarded, guarded) | guard's events |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
extra_notes = []
for line in open(os.path.join(work, "scenarios.txt")):
    name, model, faults, what = line.rstrip("\n").split("|")
    c, cw = float("nan"), float("nan")
    if os.path.exists(os.path.join(work, "clean-" + model + ".run")):
        _, cw, crow, _ = load(os.path.join(work, "clean-" + model))
        c = end_loss(crow)
    g_rc, gw, grow, gev = load(os.path.join(work, name + "-guarded"))
    g = end_loss(grow)
    if os.path.exists(os.path.join(work, name + "-unguarded.run")):
        u_rc, uw, urow, _ = load(os.path.join(work, name + "-unguarded"))
        u = end_loss(urow)
        ucol = f"{fmt(u)} ({gap(u, c)})" + ("" if u_rc == 0 else f" exit {u_rc}")
        wall = f"{uw:.0f}, {gw:.0f}"
    else:
        ucol = "—"
        wall = f"{cw:.0f}, {gw:.0f}"
    s, ds, rc_ = waste(grow, gev)
    if math.isfinite(c):
        gcol = f"{fmt(g)} ({gap(g, c)})"
    else:  # no clean counterpart: against the unguarded run
        gcol = f"{fmt(g)} ({gap(g, u)} vs unguarded)"
        ucol = f"{fmt(u)}" + ("" if u_rc == 0 else f" exit {u_rc}")
    gcol += "" if g_rc == 0 else f" exit {g_rc}"
    shown = faults if len(faults) < 40 else faults[:36] + " ..."
    print(f"| {name} | {what} (`{shown or 'none'}`) | {fmt(c) if math.isfinite(c) else '—'} | {ucol} | {gcol} | "
          f"{s} / {ds} / {rc_} | {wall} | {journal(gev)} |")
    # A slow divergence: where the trend test found it, and how far the loss was then above its
    # lowest (medians of 50 iterations of the run as it went, before any rollback).
    for e in gev:
        if e.get("event") != "slow_divergence" or e.get("signal") != "lm loss":
            continue
        found = e["iteration"]
        series = [r["lm_loss"] for r in urow if r["iteration"] <= found
                  and isinstance(r.get("lm_loss"), (int, float))] if os.path.exists(
                      os.path.join(work, name + "-unguarded.run")) else []
        meds = []
        for i in range(50, len(series) + 1):
            w = sorted(series[i - 50:i])
            meds.append((w[24] + w[25]) / 2)
        above = (meds[-1] / min(meds) - 1) * 100 if meds else float("nan")
        extra_notes.append(f"{name}: slow divergence found at iteration {found} (start {e['start']}, "
                           f"size {100 * e['size']:+.1f}%, confidence {e['confidence']:.3f}); the "
                           f"loss then {above:+.1f}% above its lowest (median of 50), "
                           f"action {e['action']}")
        break
for n in extra_notes:
    print()
    print(n)
PY
