#!/usr/bin/env python3
"""The Python layer's overhead: `python -m xmoe.examples.helloworld` against `xmoe bench` at the same shape.

Runs the two alternately (--rounds times, so that machine drift hits both alike), takes each run's median
step time after the warm-up step, and prints the medians over rounds and their ratio (Python / C++).

  OMP_WAIT_POLICY=passive python3 tools/bench_python_layer.py --xmoe build/xmoe --rounds 3 -- --batch_size 4
"""

import argparse
import os
import re
import statistics
import subprocess
import sys


def step_times(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    times = [float(t) for t in re.findall(r"STEP-\d+: loss = [-0-9.e]+, step_time = ([0-9.e-]+) sec", out)]
    losses = [float(v) for v in re.findall(r"STEP-\d+: loss = ([-0-9.e]+)", out)]
    if len(times) < 2:
        sys.exit(f"no step times in the output of {' '.join(cmd)}:\n{out}")
    return statistics.median(times[1:]), losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--xmoe", default=os.path.join(os.path.dirname(__file__), "..", "build", "xmoe"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num_steps", type=int, default=4)
    ap.add_argument("flags", nargs="*", help="helloworld / xmoe bench flags shared by both (after --)")
    args = ap.parse_args()
    shared = ["--num_steps", str(args.num_steps)] + args.flags
    cpp_cmd = [args.xmoe, "bench"] + shared
    py_cmd = [args.python, "-m", "xmoe.examples.helloworld"] + shared
    cpp, py = [], []
    for r in range(args.rounds):
        c, _ = step_times(cpp_cmd)
        p, _ = step_times(py_cmd)
        cpp.append(c)
        py.append(p)
        print(f"round {r}: xmoe bench {c:.4f} s/step, python helloworld {p:.4f} s/step, ratio {p / c:.4f}",
              flush=True)
    mc, mp = statistics.median(cpp), statistics.median(py)
    ratios = [p / c for p, c in zip(py, cpp)]
    print(f"shape: {' '.join(args.flags) or 'helloworld defaults'}; load average {os.getloadavg()[0]:.2f}")
    print(f"median step: xmoe bench {mc:.4f} s, python helloworld {mp:.4f} s; ratio python/C++ "
          f"{mp / mc:.4f} (median of per-round ratios {statistics.median(ratios):.4f})")


if __name__ == "__main__":
    main()
