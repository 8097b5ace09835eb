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
# BASELINE names a second xmoe binary (e.g. main's build): every run then alternates the two, same load, and
# each gets its own medians (an A/B in one run). PROFILE=1 adds `--profile` to both binaries' decode runs and
# prints each run's decode step profile (time share, GB/s, GFLOP/s by op class, and the step's bound: each op
# held to the larger of its bytes at the read probe and its flops at the peak). BATCHES lists the decode
# batch sizes (default "1 8 16"); SKIP_PREFILL=1 leaves out the prefill runs. OpenMP waits as the caller's
# environment says, by default xmoe's bounded spin (`xmoe info`); the profile's "threads busy" counts the spin
# unless OMP_WAIT_POLICY=passive.
#
#   tools/bench_compute.sh [build/xmoe]     env: MODEL (made with `xmoe init-model` if missing), THREADS=2,
#                                           REPS=3, DECODE_TOKENS=32, SKIP_LAYER=1 to leave out `xmoe bench`,
#                                           PRECISION=highest, BASELINE, PROFILE, BATCHES, SKIP_PREFILL,
#                                           ISA (cap the kernel level, e.g. avx2: an AVX2-only CPU's kernels;
#                                           the training layer's too)
set -euo pipefail
XMOE=${1:-build/xmoe}
MODEL=${MODEL:-/tmp/xmoe-qwen3-30b-a3b-8layers}
THREADS=${THREADS:-2}
REPS=${REPS:-3}
DECODE_TOKENS=${DECODE_TOKENS:-32}
read -r -a PRECISIONS <<<"${PRECISION:-highest}"
read -r -a BATCH_SIZES <<<"${BATCHES:-1 8 16}"
# Binaries by label: "new" (the argument) and, with BASELINE, "base"; runs alternate them.
declare -A BINS=([new]="$XMOE")
LABELS=(new)
if [ -n "${BASELINE:-}" ]; then
  BINS[base]="$BASELINE"
  LABELS=(base new)
fi
PROFILE_FLAG=()
[ "${PROFILE:-0}" = 1 ] && PROFILE_FLAG=(--profile)
cd "$(dirname "$0")/.."
[ -f "$MODEL/config.json" ] || "$XMOE" init-model --config configs/qwen3-30b-a3b-8layers.json --out "$MODEL"
"$XMOE" info | grep -E "^(cpu features|openmp wait)"

# Token ids spread over the vocabulary; prompt s of a batch starts elsewhere, so sequences differ.
ids() { seq 0 $(($1 - 1)) | awk -v s="$2" '{printf "%s%d", (NR > 1 ? "," : ""), ((NR + 997 * s) * 7919) % 150000 + 10}'; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
# The number after `key` in each line of $1 that contains `key`.
field() { grep -o -- "$2 [0-9.]*" <<<"$1" | awk '{print $NF}'; }

common=(--model "$MODEL" --threads "$THREADS" --ignore-eos --temperature 1 --seed 1 --warmup --measure-bandwidth)
[ -n "${ISA:-}" ] && common+=(--isa "$ISA")

if [ "${SKIP_PREFILL:-0}" != 1 ]; then
  echo "== prefill: 512-token prompt, $THREADS threads, $REPS runs, matmul precision ${PRECISIONS[*]}, binaries ${LABELS[*]}"
  declare -A rates gflops shares
  for r in $(seq "$REPS"); do
    for p in "${PRECISIONS[@]}"; do
      for b in "${LABELS[@]}"; do
        out=$("${BINS[$b]}" generate "${common[@]}" --matmul-precision "$p" --prompt-ids "$(ids 512 0)" --max-tokens 1 \
          --no-stream 2>&1 >/dev/null)
        line=$(grep "^prefill compute:" <<<"$out")
        rates[$p/$b]+="$(field "$(grep '^prefill:' <<<"$out")" '=') "
        gflops[$p/$b]+="$(field "$line" 'all,') "
        shares[$p/$b]+="$(grep -o '= [0-9.]* % of the register' <<<"$line" | awk '{print $2}') "
        echo "  run $r $p $b: $(grep '^prefill:' <<<"$out"); $line; load $(cut -d' ' -f1-3 /proc/loadavg)"
      done
    done
  done
  for p in "${PRECISIONS[@]}"; do
    for b in "${LABELS[@]}"; do
      echo "prefill median ($p, $b): $(tr ' ' '\n' <<<"${rates[$p/$b]}" | grep . | median) tokens/s, $(tr ' ' '\n' <<<"${gflops[$p/$b]}" | grep . | median) GFLOP/s = $(tr ' ' '\n' <<<"${shares[$p/$b]}" | grep . | median) % of the peak of its arithmetic"
    done
  done
fi

for batch in "${BATCH_SIZES[@]}"; do
  echo "== decode: $batch sequences x $DECODE_TOKENS tokens, 32-token prompts, $THREADS threads, $REPS runs, matmul precision ${PRECISIONS[*]}, binaries ${LABELS[*]}"
  prompts=()
  for s in $(seq 0 $((batch - 1))); do prompts+=(--prompt-ids "$(ids 32 "$s")"); done
  unset rates shares between steady
  declare -A rates shares between steady
  for r in $(seq "$REPS"); do
    for p in "${PRECISIONS[@]}"; do
      for b in "${LABELS[@]}"; do
        # Both binaries profiled or neither, so the profiler's cost is on both sides of an A/B.
        flags=("${PROFILE_FLAG[@]}")
        out=$("${BINS[$b]}" generate "${common[@]}" "${flags[@]}" --matmul-precision "$p" "${prompts[@]}" \
          --max-tokens "$DECODE_TOKENS" --no-stream 2>&1 >/dev/null)
        dline=$(grep "^decode:" <<<"$out")
        roof=$(grep "^decode roofline:" <<<"$out")
        ceiling=$(grep "^decode compute ceiling:" <<<"$out")
        rates[$p/$b]+="$(grep -o '= [0-9.]* tokens/s' <<<"$dline" | awk '{print $2}') "
        shares[$p/$b]+="$(grep -o 'achieved [0-9.]*' <<<"$roof" | awk '{print $2}') "
        # The roofline again at the read probes run between the steps (the bandwidth moves within seconds).
        steps=$(grep "^decode against a read probe between steps" <<<"$out")
        between[$p/$b]+="$(grep -o '[0-9.]* % of the roofline at the probes' <<<"$steps" | awk '{print $1}') "
        # A run whose probes between steps stayed within 25 % met one host state throughout: its share says
        # what that state allows, where the medians above mix runs that met either.
        steady[$p/$b]+=$(sed -nE 's/.*probes ([0-9.]+)-([0-9.]+) GB\/s, median ([0-9.]+)\): ([0-9.]+) % .*per step: median ([0-9.]+) %.*/\1 \2 \3 \4 \5/p' <<<"$steps" |
          awk '$2 <= 1.25 * $1 {printf "%s %% (per step %s %%) at %s GB/s, ", $4, $5, $3}')
        echo "  run $r $p $b: $dline; $roof; $steps; $ceiling; load $(cut -d' ' -f1-3 /proc/loadavg)"
        if [ "${#flags[@]}" -gt 0 ]; then
          sed -n '/^profile: /p; /^profile decode:/,/^  bound: /p' <<<"$out" | sed 's/^/    /'
        fi
      done
    done
  done
  for p in "${PRECISIONS[@]}"; do
    for b in "${LABELS[@]}"; do
      echo "decode batch $batch median ($p, $b): $(tr ' ' '\n' <<<"${rates[$p/$b]}" | grep . | median) tokens/s aggregate = $(tr ' ' '\n' <<<"${shares[$p/$b]}" | grep . | median) % of the roofline ($(tr ' ' '\n' <<<"${between[$p/$b]}" | grep . | median) % at the probes between steps); runs in one host state (probes between steps within 25 %): $(sed 's/, $//' <<<"${steady[$p/$b]:-none}")"
    done
  done
done

if [ "${SKIP_LAYER:-0}" != 1 ]; then
  for dtype in float32 bfloat16; do
    echo "== training layer: xmoe bench (Tutel helloworld defaults), $dtype, $THREADS threads${ISA:+, kernel level $ISA}"
    "$XMOE" bench --threads "$THREADS" --dtype "$dtype" ${ISA:+--isa "$ISA"} 2>&1 | grep -E "Summary|Experts|FMA peak"
    echo "  load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
fi
