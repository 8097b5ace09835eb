#!/usr/bin/env bash
# Fuzz campaigns (not part of CI). Builds the libFuzzer targets with clang-14, AddressSanitizer and UBSan in
# build-fuzz/ if needed (Debian: clang-14 libclang-rt-14-dev libomp-14-dev, which tools/install-deps.sh leaves
# out because CI does not fuzz: this script installs them with apt-get when they are missing), then:
#
#   tools/fuzz.sh TARGET SECONDS [LIBFUZZER_FLAG...]
#                                   runs one campaign on tests/fuzz/fuzz_TARGET.cpp: one process, inputs kept in
#                                   build-fuzz/corpus/TARGET, crashes in build-fuzz/artifacts/TARGET/, the
#                                   log (each line prefixed by the seconds elapsed, for the coverage over
#                                   time) in build-fuzz/logs/TARGET.log
#   tools/fuzz.sh --minimize TARGET replaces tests/fuzz/corpus/TARGET by the smallest set of inputs (up to
#                                   1 KB each, 2 KB for tokenizer_json) that keeps the edge coverage of the
#                                   committed and the campaign's inputs of that size; inputs that found a
#                                   bug (crash-*, timeout-*, other names) are always kept
#   tools/fuzz.sh --summary TARGET  from the last campaign's log: executions, exec/s, edges (cov) after
#                                   start-up, at half time and at the end, and the time of the last new edge
#   tools/fuzz.sh --retime TARGET   re-times the campaign's slow units and timeouts (build-fuzz/artifacts/TARGET/
#                                   slow-unit-*, timeout-*) by CPU time, user + system, per execution: a loaded
#                                   machine stretches wall time tenfold, and the hang criterion is CPU time
#   tools/fuzz.sh --list            prints the targets
#
# Environment: FUZZ_BIN_DIR=DIR runs the binaries already in DIR (no build: a campaign can start while
# build-fuzz/ is rebuilding, or run a saved binary); FUZZ_LOG_DIR=DIR keeps the logs there instead of
# build-fuzz/logs (--summary reads them from the same place).
#
# Limits: a hang is an input taking over 1 s; the process may not use over 2 GB RSS, and no single allocation
# may exceed 256 MB: a header that claims gigabytes must be refused, not allocated.
set -euo pipefail
# The whole script is one group, read before any of it runs: bash otherwise reads a script as it goes, and
# editing this file during a campaign made the running copy resume mid-line in the --minimize code and delete
# the committed corpus.
{
cd "$(dirname "$0")/.."
targets=$(cd tests/fuzz && ls fuzz_*.cpp | sed 's/^fuzz_//; s/\.cpp$//')
usage() {
  echo "usage: $0 TARGET SECONDS [LIBFUZZER_FLAG...] | --minimize TARGET | --summary TARGET | --retime TARGET |" \
    "--list" >&2
  echo "targets: $(echo $targets)" >&2
  exit 2
}
[ $# -ge 1 ] || usage
if [ "$1" = "--list" ]; then
  echo "$targets"
  exit 0
fi
mode=run
if [ "$1" = "--minimize" ] || [ "$1" = "--summary" ] || [ "$1" = "--retime" ]; then
  mode=${1#--}
  shift
fi
[ $# -ge 1 ] || usage
target=$1
grep -qx "$target" <<<"$targets" || usage  # not echo | grep -q: under pipefail, grep's early exit fails echo

if [ "$mode" = summary ]; then
  # The coverage has plateaued when the edge count at half time is the final one.
  log=${FUZZ_LOG_DIR:-build-fuzz/logs}/$target.log
  [ -f "$log" ] || { echo "$0: no campaign log $log" >&2; exit 1; }
  awk -v target="$target" '
    { t = $1 }
    /INITED cov: / { for (i = 1; i <= NF; ++i) if ($i == "cov:") init = $(i + 1) }
    /(NEW|pulse|REDUCE|INITED) +cov: / {
      for (i = 1; i <= NF; ++i) if ($i == "cov:") c = $(i + 1)
      times[n] = t; covs[n] = c; ++n
      if (c != last) { last = c; last_new = t }
    }
    /stat::number_of_executed_units:/ { runs = $3 }
    /stat::average_exec_per_sec:/ { rate = $3 }
    END {
      half = t / 2; at_half = init
      for (i = 0; i < n; ++i) if (times[i] <= half) at_half = covs[i]
      printf "%s: %s executions in %d s, %s exec/s; edges %s at start-up, %s at %d s, %s at the end " \
             "(last new edge at %d s): plateau %s\n", target, runs, t, rate, init, at_half, half, last,
             last_new, (at_half == last ? "yes" : "no")
    }' "$log"
  exit 0
fi

# The fuzz toolchain, installed on first use (CI never needs it).
toolchain=(clang-14 libclang-rt-14-dev libomp-14-dev)
missing=()
for p in "${toolchain[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "tools/fuzz.sh: installing the fuzz toolchain (${missing[*]}) with apt-get;" \
    "tools/install-deps.sh leaves it out because CI does not fuzz" >&2
  sudo_=""
  if [ "$(id -u)" -ne 0 ]; then sudo_="sudo"; fi
  $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >/dev/null || {
    echo "tools/fuzz.sh: could not install ${missing[*]}; install them (Debian 12) and rerun" >&2
    exit 1
  }
fi

if [ ! -f build-fuzz/CMakeCache.txt ]; then
  launcher=()
  if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
  cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++-14 -DXMOE_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "${launcher[@]}" >/dev/null
fi
if [ -n "${FUZZ_BIN_DIR:-}" ]; then
  binary=$FUZZ_BIN_DIR/fuzz_$target
else
  cmake --build build-fuzz -j"$(nproc)" --target "fuzz_$target" >/dev/null
  binary=build-fuzz/tests/fuzz/fuzz_$target
fi
committed=tests/fuzz/corpus/$target
work=build-fuzz/corpus/$target
seeds=build-fuzz/seeds-$target  # one per campaign: two campaigns may run at once
mkdir -p "$work" "$committed" "build-fuzz/artifacts/$target"
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
limits=(-rss_limit_mb=2048 -malloc_limit_mb=256 -timeout=1)
# Inputs stay short where the structure is (headers, bodies, model text), so a campaign makes many executions;
# templates and tokenizer.json files are longer by nature.
case "$target" in
  # 8 KB, with the fixtures shrunk to 300 vocabulary entries as seeds (tools/make_fuzz_seeds.py): the loader
  # runs the same code for 300 entries as for 150k, and parsing 40-80 KB of JSON per input took 64 % of the
  # time (about 390 exec/s). The full fixtures and the id bound (< 2^20) are tested in tests/llm/test_tokenizer.cpp.
  tokenizer_json) max_len=8192 ;;
  jinja_template | chat_template_render) max_len=16384 ;;
  *) max_len=4096 ;;
esac
# The largest input a committed corpus keeps (find -size, in bytes): 1 KB, so that all corpora stay under 1 MB
# together (du -sb, directories included) as the campaigns find more edges; the merge then keeps the smallest
# inputs that reach the same edges. Measured on the merged corpora: 1 KB instead of 2 KB loses 0.3-2 % of a
# target's edges (safetensors 1880 -> 1860 for 23 KB less), but 6.6 % of tokenizer_json's, whose structure
# is longer, so it keeps 2 KB.
case "$target" in
  tokenizer_json) keep=-2049c ;;
  *) keep=-1025c ;;
esac

if [ "$mode" = retime ]; then
  # One run and three runs of the input in one process each: the difference over two is one execution, without
  # the process start-up and the fixtures a target builds on its first input. libFuzzer's leak check would run
  # the first input twice, so it is off (leaks are the campaign's to find).
  cpu() {
    local TIMEFORMAT='%U %S'
    { time "$binary" -detect_leaks=0 "$@" >/dev/null 2>&1; } 2>&1 | awk "NF == 2 { s = \$1 + \$2 } END { print s }"
  }
  found=0
  for f in "build-fuzz/artifacts/$target"/slow-unit-* "build-fuzz/artifacts/$target"/timeout-*; do
    [ -f "$f" ] || continue
    found=1
    one=$(cpu "$f")
    three=$(cpu "$f" "$f" "$f")
    awk -v f="$f" -v size="$(wc -c <"$f")" -v one="$one" -v three="$three" 'BEGIN {
      per = (three - one) / 2
      printf "%s (%d bytes): %.2f s CPU per execution%s\n", f, size, per, (per > 1 ? ": over 1 s, a hang" : "")
    }'
  done
  [ "$found" = 1 ] || echo "$target: no slow units or timeouts in build-fuzz/artifacts/$target"
  exit 0
fi

if [ "$mode" = minimize ]; then
  # Small inputs only, so the committed corpora stay small; merge keeps those adding coverage.
  small=$(mktemp -d)
  merged=$(mktemp -d)
  trap 'rm -rf "$small" "$merged"' EXIT
  find "$work" "$committed" -maxdepth 1 -type f -size "$keep" -regextype egrep -regex '.*/[0-9a-f]{40}' \
    -exec cp {} "$small/" \;
  # Edge coverage only (-use_counters=0): hit counts would keep hundreds of near-duplicates per target.
  # Artifacts (an input over the time limit while merging) go with the campaign's, not into the working directory.
  "$binary" -merge=1 -use_counters=0 -use_value_profile=0 "${limits[@]}" \
    -artifact_prefix="build-fuzz/artifacts/$target/" "$merged" "$small" 2>&1 | grep -E "MERGE-OUTER: [0-9]+ new files" || true
  # Inputs that found a bug (crash-*, timeout-*, named ones) stay whatever their coverage.
  find "$committed" -maxdepth 1 -type f -regextype egrep -regex '.*/[0-9a-f]{40}' -delete
  cp "$merged"/* "$committed/"
  echo "$committed: $(ls "$committed" | wc -l) files, $(du -sh "$committed" | cut -f1)"
  exit 0
fi

[ $# -ge 2 ] || usage
seconds=$2
shift 2  # the rest goes to libFuzzer, e.g. -runs=1000000 to stop after a million executions
rm -rf "$seeds"
python3 tools/make_fuzz_seeds.py "$seeds"
logs=${FUZZ_LOG_DIR:-build-fuzz/logs}
mkdir -p "$logs"
log=$logs/$target.log
# Every line prefixed with the seconds since the start: libFuzzer's "#N NEW cov: E" lines then give the edge
# count over time, and whether it still grew in the second half of the campaign.
set +e
SECONDS=0
"$binary" "$work" "$committed" "$seeds/$target" "${limits[@]}" -max_len=$max_len -max_total_time="$seconds" \
  -artifact_prefix="build-fuzz/artifacts/$target/" -print_final_stats=1 "$@" 2>&1 |
  while IFS= read -r line; do printf '%5d %s\n' "$SECONDS" "$line"; done | tee "$log"
status=${PIPESTATUS[0]}
set -e
exit "$status"
}
