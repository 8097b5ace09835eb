#!/usr/bin/env bash
# Fuzz campaigns (not part of CI). Builds the libFuzzer targets with clang-14, AddressSanitizer and UBSan in
# build-fuzz/ if needed (Debian: clang-14 libclang-rt-14-dev libomp-14-dev), then:
#
#   tools/fuzz.sh TARGET SECONDS    runs one campaign on tests/fuzz/fuzz_TARGET.cpp: one process, inputs kept in
#                                   build-fuzz/corpus/TARGET, crashes in build-fuzz/artifacts/TARGET/
#   tools/fuzz.sh --minimize TARGET replaces tests/fuzz/corpus/TARGET by the smallest set of inputs (up to
#                                   32 KB each, 8 KB for tokenizer.json) that keeps the edge coverage of
#                                   the committed and the campaign's inputs; inputs that found a bug
#                                   (crash-*, timeout-*, other names) are always kept
#   tools/fuzz.sh --list            prints the targets
#
# Limits: a hang is an input taking over 1 s; the process may not use over 2 GB RSS, and no single allocation
# may exceed 256 MB: a header that claims gigabytes must be refused, not allocated.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=$(cd tests/fuzz && ls fuzz_*.cpp | sed 's/^fuzz_//; s/\.cpp$//')
usage() {
  echo "usage: $0 TARGET SECONDS | --minimize TARGET | --list" >&2
  echo "targets: $(echo $targets)" >&2
  exit 2
}
[ $# -ge 1 ] || usage
if [ "$1" = "--list" ]; then
  echo "$targets"
  exit 0
fi
mode=run
if [ "$1" = "--minimize" ]; then
  mode=minimize
  shift
fi
[ $# -ge 1 ] || usage
target=$1
echo "$targets" | grep -qx "$target" || usage

if [ ! -f build-fuzz/CMakeCache.txt ]; then
  launcher=()
  if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
  cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++-14 -DXMOE_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "${launcher[@]}" >/dev/null
fi
cmake --build build-fuzz -j"$(nproc)" --target "fuzz_$target" >/dev/null
binary=build-fuzz/tests/fuzz/fuzz_$target
committed=tests/fuzz/corpus/$target
work=build-fuzz/corpus/$target
seeds=build-fuzz/seeds
mkdir -p "$work" "$committed" "build-fuzz/artifacts/$target"
# The checkpoint targets write each input to a scratch directory: keep it in memory, where a loaded disk cannot
# turn a file write into a false "hang".
if [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
limits=(-rss_limit_mb=2048 -malloc_limit_mb=256 -timeout=1)
# Inputs stay short where the structure is (headers, bodies, model text), so a campaign makes many executions;
# templates and tokenizer.json files are longer by nature.
case "$target" in
  tokenizer_json) max_len=262144 keep=-9k ;;
  jinja_template | chat_template_render) max_len=16384 ;;
  *) max_len=4096 ;;
esac
keep=${keep:--33k}  # the largest input (find -size) a committed corpus keeps

if [ "$mode" = minimize ]; then
  # Small inputs only, so the committed corpora stay small; merge keeps those adding coverage.
  small=$(mktemp -d)
  merged=$(mktemp -d)
  trap 'rm -rf "$small" "$merged"' EXIT
  find "$work" "$committed" -maxdepth 1 -type f -size "$keep" -regextype egrep -regex '.*/[0-9a-f]{40}' \
    -exec cp {} "$small/" \;
  # Edge coverage only (-use_counters=0): hit counts would keep hundreds of near-duplicates per target.
  "$binary" -merge=1 -use_counters=0 -use_value_profile=0 "${limits[@]}" "$merged" "$small" 2>&1 | grep -E "MERGE-OUTER: [0-9]+ new files" || true
  # Inputs that found a bug (crash-*, timeout-*, named ones) stay whatever their coverage.
  find "$committed" -maxdepth 1 -type f -regextype egrep -regex '.*/[0-9a-f]{40}' -delete
  cp "$merged"/* "$committed/"
  echo "$committed: $(ls "$committed" | wc -l) files, $(du -sh "$committed" | cut -f1)"
  exit 0
fi

[ $# -eq 2 ] || usage
seconds=$2
rm -rf "$seeds"
python3 tools/make_fuzz_seeds.py "$seeds"
"$binary" "$work" "$committed" "$seeds/$target" "${limits[@]}" -max_len=$max_len -max_total_time="$seconds" \
  -artifact_prefix="build-fuzz/artifacts/$target/" -print_final_stats=1
