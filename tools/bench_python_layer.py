#!/usr/bin/env python3
"""The Python layer's overhead: `python -m xmoe.examples.helloworld` against `xmoe bench` at the same shape.

Runs the two alternately (--rounds times, so that machine drift hits both alike), takes each run's median
step time after the warm-up step, and prints the medians over rounds and their ratio (Python / C++). On a
loaded machine the two programs' step times drift apart by more than the overhead; so it also runs
helloworld's step in this process with the C++ layer's forward/backward calls timed, and prints the share of
the step spent outside them (the Python layer, autograd, the head and torch.optim), which is what Python
adds over `xmoe bench` (whose step is the same C++ calls plus a C++ head and SGD), and the same share for the
layer's forward and backward alone (no head, no optimizer).

  OMP_WAIT_POLICY=passive python3 tools/bench_python_layer.py --xmoe build/xmoe --rounds 3 -- --batch_size 4
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time


def step_times(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    times = [float(t) for t in re.findall(r"STEP-\d+: loss = [-0-9.e]+, step_time = ([0-9.e-]+) sec", out)]
    losses = [float(v) for v in re.findall(r"STEP-\d+: loss = ([-0-9.e]+)", out)]
    if len(times) < 2:
        sys.exit(f"no step times in the output of {' '.join(cmd)}:\n{out}")
    return statistics.median(times[1:]), losses


class _TimedLayer:
    """Forwards to an xmoe._xmoe.Layer, adding up the seconds spent in its forward and backward."""

    def __init__(self, layer, clock):
        self._layer, self._clock = layer, clock

    def forward(self, *a):
        t = time.perf_counter()
        try:
            return self._layer.forward(*a)
        finally:
            self._clock[0] += time.perf_counter() - t

    def backward(self, *a):
        t = time.perf_counter()
        try:
            return self._layer.backward(*a)
        finally:
            self._clock[0] += time.perf_counter() - t

    def __getattr__(self, name):
        return getattr(self._layer, name)


def python_share(flags, steps):
    """helloworld's training step in this process: (median step seconds, median share outside the C++ calls)."""
    import torch
    import torch.nn.functional as F

    from xmoe import moe as tutel_moe
    o = argparse.ArgumentParser()
    for name, default in (("batch_size", 16), ("num_tokens", 512), ("model_dim", 2048), ("hidden_size", 2048),
                          ("num_local_experts", 2), ("top", 2)):
        o.add_argument("--" + name, type=int, default=default)
    o.add_argument("--capacity_factor", type=float, default=1.0)
    a, _ = o.parse_known_args(flags)
    layer = tutel_moe.moe_layer(gate_type={"type": "top", "k": a.top, "capacity_factor": a.capacity_factor},
                                model_dim=a.model_dim, experts={"type": "ffn", "count_per_node": a.num_local_experts,
                                                                "hidden_size_per_expert": a.hidden_size,
                                                                "activation_fn": lambda x: F.relu(x)},
                                seeds=(1, 1, 1))
    opt = torch.optim.SGD(layer.parameters(), lr=1e-4)
    x = torch.randn(a.batch_size, a.num_tokens, a.model_dim)
    y = torch.zeros(a.batch_size, dtype=torch.long)
    clock = [0.0]
    totals, shares = [], []
    for i in range(steps):
        for core in layer._cores.values():
            if not isinstance(core.layer, _TimedLayer):
                core.layer = _TimedLayer(core.layer, clock)
        clock[0] = 0.0
        t = time.perf_counter()
        opt.zero_grad()
        loss = F.nll_loss(F.log_softmax(torch.sum(layer(x), dim=2), dim=1), y)
        loss.backward()
        opt.step()
        total = time.perf_counter() - t
        if i > 0:
            totals.append(total)
            shares.append((total - clock[0]) / total)
    # The layer alone (forward, then backward from a fixed dy; no head, no optimizer): what the Python layer
    # adds over calling xmoe's C++ layer directly.
    dy = torch.randn(a.batch_size, a.num_tokens, a.model_dim)
    layer_totals, layer_shares = [], []
    for i in range(steps):
        clock[0] = 0.0
        t = time.perf_counter()
        layer(x).backward(dy)
        total = time.perf_counter() - t
        if i > 0:
            layer_totals.append(total)
            layer_shares.append((total - clock[0]) / total)
    return (statistics.median(totals), statistics.median(shares), statistics.median(layer_totals),
            statistics.median(layer_shares))


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
    step, share, layer_step, layer_share = python_share(args.flags, args.num_steps)
    print(f"in process: median step {step:.4f} s, of which {100 * share:.2f} % outside xmoe's C++ forward/backward "
          f"(Python layer, autograd, head, torch.optim)")
    print(f"in process, the layer alone: median forward+backward {layer_step:.4f} s, of which {100 * layer_share:.2f} "
          f"% outside xmoe's C++ forward/backward (the Python layer's overhead over calling the C++ directly)")


if __name__ == "__main__":
    main()
