#!/usr/bin/env bash
# Builds xmoe and runs the whole test suite twice: optimised, then under AddressSanitizer + UBSan; the
# server's Python tests (SDKs, browser) run once, against the optimised build.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# The free disk, first: CI machines have been seen with little of it, and pip's "No space left on device" is
# then the first failure. pip keeps no wheel cache (the venvs are made once per run), which halves what it
# writes.
df -h . | tail -n 1 | awk '{print "disk: " $4 " free of " $2}'
export PIP_NO_CACHE_DIR=1
# A compiler cache (unless the caller chose a launcher): `pip install .` below compiles the core library again,
# and with position-independent code in the optimised tree too its commands are the same, so they are cache
# hits instead of a third compile of src/.
if [ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ] && command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_POSITION_INDEPENDENT_CODE=ON >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
# The server end to end, once, against the optimised build: the official openai/anthropic SDKs, httpx,
# Selenium (headless Chromium), and transformers' tokenizer and chat template (jinja2; no torch) as the usage
# oracle, from PyPI in a venv under the build folder.
python3 -m venv build/venv
build/venv/bin/pip install -q --disable-pip-version-check openai anthropic selenium httpx pytest transformers jinja2
XMOE_CLI="$PWD/build/xmoe" build/venv/bin/python -m pytest tests/serve -q -p no:cacheprovider
# The Python package (xmoe.moe, xmoe.LLM) against PyTorch, once: `pip install .` (scikit-build-core and
# nanobind from PyPI build the extension and the core library it links, nothing else) into a venv that sees
# Debian's python3-torch and pytest.
# Debian's own interpreter: a python3 earlier on PATH (pyenv, conda) does not see Debian's packages.
debian_python=/usr/bin/python3
[ -x "$debian_python" ] || debian_python=python3
"$debian_python" -m venv --system-site-packages build/venv-torch
# The optimised tree's compiler (scikit-build-core would otherwise take Python's, another name for the same g++,
# and miss the compiler cache).
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' build/CMakeCache.txt)
CXX="$cxx" CMAKE_GENERATOR="Unix Makefiles" CMAKE_BUILD_PARALLEL_LEVEL="$jobs" \
  build/venv-torch/bin/pip install -q --disable-pip-version-check .
XMOE_CLI="$PWD/build/xmoe" build/venv-torch/bin/python -m pytest python/tests -q -p no:cacheprovider
# Expert parallelism from Python: two ranks against the single-process layer, with the MPI tests' Open MPI
# settings (tests/mpi/CMakeLists.txt: containers, more ranks than cores, a short collective timeout).
OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 XMOE_COMM_TIMEOUT_S=60 \
  OMP_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root -np 2 \
  build/venv-torch/bin/python python/tests/mpi_expert_parallel.py
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DXMOE_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs"
