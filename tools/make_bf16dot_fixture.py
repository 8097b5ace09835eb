#!/usr/bin/env python3
"""PyTorch's oracle for the `medium` matmul precision (tests/llm/test_linear_bf16dot): a random x [17, 300]
(f32), a bf16 weight w [40, 300], and in float64 the product of the bf16-rounded operands
y64 = bf16(x) @ w.T with abs_sum = |bf16(x)| @ |w|.T (the scale of the f32 error bound the test applies).

    /work/venv/bin/python tools/make_bf16dot_fixture.py [--out tests/data/linear_bf16dot/case.safetensors]
"""
import argparse
import os

import torch
from safetensors.torch import save_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                                                  "linear_bf16dot", "case.safetensors"))
    args = ap.parse_args()
    g = torch.Generator().manual_seed(20261204)
    m, n, k = 17, 40, 300
    # Magnitudes spread over a few binades, so sums cancel and round.
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-4, 5, (m, k), generator=g).float())
    w = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)
    xb = x.to(torch.bfloat16).double()  # round to nearest even, as the kernel does
    wd = w.double()
    y64 = xb @ wd.T
    abs_sum = xb.abs() @ wd.abs().T
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_file({"x": x.contiguous(), "w": w.contiguous(), "y64": y64.contiguous(), "abs_sum": abs_sum.contiguous()},
              args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
