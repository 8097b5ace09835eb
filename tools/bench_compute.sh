#!/usr/bin/env bash
# Issue 12's figures in one command, each a median of REPS runs with its limit measured in the same run:
#   prefill of a 512-token prompt on configs/qwen3-30b-a3b-8layers.json (GFLOP/s and share of the register-only
#   FMA peak), aggregate decode tok/s of 1, 8 and 16 sequences decoding different prompts and seeds (share of
#   the bandwidth roofline of the bytes each step reads), and the training layer at Tutel's helloworld defaults
#   (step time, share of the FMA peak). Prints the load average with each figure (shared machines).
#
# PRECISION lists --matmul-precision values (e.g. "highest medium"): each run goes through them in turn, so
# the precisions alternate under the same load, and each gets its own medians. Decode runs also print the
# step's compute ceiling (its flops at the register-only peak of that precision's arithmetic).
#
#   tools/bench_compute.sh [build/xmoe]     env: MODEL (made with `xmoe init-model` if missing), THREADS=2,
#                                           REPS=3, DECODE_TOKENS=32, SKIP_LAYER=1 to leave out `xmoe bench`,
#                                           PRECISION=highest
set -euo pipefail
XMOE=${1:-build/xmoe}
MODEL=${MODEL:-/tmp/xmoe-qwen3-30b-a3b-8layers}
THREADS=${THREADS:-2}
REPS=${REPS:-3}
DECODE_TOKENS=${DECODE_TOKENS:-32}
read -r -a PRECISIONS <<<"${PRECISION:-highest}"
export OMP_WAIT_POLICY=passive
cd "$(dirname "$0")/.."
[ -f "$MODEL/config.json" ] || "$XMOE" init-model --config configs/qwen3-30b-a3b-8layers.json --out "$MODEL"
"$XMOE" info | grep -m1 "cpu features"

# Token ids spread over the vocabulary; prompt s of a batch starts elsewhere, so sequences differ.
ids() { seq 0 $(($1 - 1)) | awk -v s="$2" '{printf "%s%d", (NR > 1 ? "," : ""), ((NR + 997 * s) * 7919) % 150000 + 10}'; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
# The number after `key` in each line of $1 that contains `key`.
field() { grep -o -- "$2 [0-9.]*" <<<"$1" | awk '{print $NF}'; }

common=(--model "$MODEL" --threads "$THREADS" --ignore-eos --temperature 1 --seed 1 --warmup --measure-bandwidth)

echo "== prefill: 512-token prompt, $THREADS threads, $REPS runs, matmul precision ${PRECISIONS[*]}"
declare -A rates gflops shares
for r in $(seq "$REPS"); do
  for p in "${PRECISIONS[@]}"; do
    out=$("$XMOE" generate "${common[@]}" --matmul-precision "$p" --prompt-ids "$(ids 512 0)" --max-tokens 1 \
      --no-stream 2>&1 >/dev/null)
    line=$(grep "^prefill compute:" <<<"$out")
    rates[$p]+="$(field "$(grep '^prefill:' <<<"$out")" '=') "
    gflops[$p]+="$(field "$line" 'all,') "
    shares[$p]+="$(grep -o '= [0-9.]* % of the register' <<<"$line" | awk '{print $2}') "
    echo "  run $r $p: $(grep '^prefill:' <<<"$out"); $line; load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
done
for p in "${PRECISIONS[@]}"; do
  echo "prefill median ($p): $(tr ' ' '\n' <<<"${rates[$p]}" | grep . | median) tokens/s, $(tr ' ' '\n' <<<"${gflops[$p]}" | grep . | median) GFLOP/s = $(tr ' ' '\n' <<<"${shares[$p]}" | grep . | median) % of the peak of its arithmetic"
done

for batch in 1 8 16; do
  echo "== decode: $batch sequences x $DECODE_TOKENS tokens, 32-token prompts, $THREADS threads, $REPS runs, matmul precision ${PRECISIONS[*]}"
  prompts=()
  for s in $(seq 0 $((batch - 1))); do prompts+=(--prompt-ids "$(ids 32 "$s")"); done
  unset rates shares
  declare -A rates shares
  for r in $(seq "$REPS"); do
    for p in "${PRECISIONS[@]}"; do
      out=$("$XMOE" generate "${common[@]}" --matmul-precision "$p" "${prompts[@]}" --max-tokens "$DECODE_TOKENS" \
        --no-stream 2>&1 >/dev/null)
      dline=$(grep "^decode:" <<<"$out")
      roof=$(grep "^decode roofline:" <<<"$out")
      ceiling=$(grep "^decode compute ceiling:" <<<"$out")
      rates[$p]+="$(grep -o '= [0-9.]* tokens/s' <<<"$dline" | awk '{print $2}') "
      shares[$p]+="$(grep -o 'achieved [0-9.]*' <<<"$roof" | awk '{print $2}') "
      echo "  run $r $p: $dline; $roof; $ceiling; load $(cut -d' ' -f1-3 /proc/loadavg)"
    done
  done
  for p in "${PRECISIONS[@]}"; do
    echo "decode batch $batch median ($p): $(tr ' ' '\n' <<<"${rates[$p]}" | grep . | median) tokens/s aggregate = $(tr ' ' '\n' <<<"${shares[$p]}" | grep . | median) % of the roofline"
  done
done

if [ "${SKIP_LAYER:-0}" != 1 ]; then
  for dtype in float32 bfloat16; do
    echo "== training layer: xmoe bench (Tutel helloworld defaults), $dtype, $THREADS threads"
    "$XMOE" bench --threads "$THREADS" --dtype "$dtype" 2>&1 | grep -E "Summary|Experts|FMA peak"
    echo "  load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
fi
