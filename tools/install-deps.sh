#!/usr/bin/env bash
# Installs what xmoe needs to build and test on Debian 12 (bookworm): compilers and libraries, and for the
# server's tests a Python venv (the SDKs come from PyPI in tools/run-tests.sh) and headless Chromium; for the
# Python package's tests Debian's PyTorch (the oracle) and pytest, and the DLPack header of the C ABI; the
# GEMM benchmark's peers; ccache, which lets run-tests.sh's builds share compiles. The fuzz campaigns' clang-14
# (not run by CI) is installed by tools/fuzz.sh itself.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  g++ ccache cmake make libgomp1 libgtest-dev nlohmann-json3-dev libcli11-dev openmpi-bin libopenmpi-dev \
  pkg-config libonig-dev libicu-dev libcpp-httplib-dev libdlpack-dev python3-venv chromium chromium-driver \
  python3-torch python3-pytest >/dev/null
# Peers of the GEMM benchmark (bench/gemm_bench.cpp, built when either is present): oneDNN and OpenBLAS.
$SUDO apt-get install -y -qq --no-install-recommends libdnnl-dev libopenblas-dev >/dev/null
