#!/usr/bin/env python3
"""Writes tests/data/safetensors/reference.safetensors with the official `safetensors` package, plus
reference.json holding the values the C++ reader must return, so the test checks interoperability rather
than our writer against our reader.

Needs torch (for bfloat16) and safetensors, e.g.:
  /usr/bin/python3 -m venv --system-site-packages /tmp/st/venv2
  /tmp/st/venv2/bin/pip install safetensors
  /tmp/st/venv2/bin/python tools/make_safetensors_fixture.py
"""
import json
import pathlib

import torch
from safetensors.torch import save_file

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "safetensors"


def main():
    tensors = {
        "f32": torch.tensor([[1.5, -2.25, 3.0], [0.0, 1e-3, -7.75]], dtype=torch.float32),
        # Values not exactly representable in bf16 exercise the writer's rounding; we record what it stored.
        "bf16": torch.tensor([1.0, -0.5, 3.140625, 1000.0, 0.1], dtype=torch.bfloat16),
        "f64": torch.tensor([[[0.1], [-1e300]], [[2.5], [3.0]]], dtype=torch.float64),
        "i64": torch.tensor([-9007199254740991, 0, 42], dtype=torch.int64),
        "u8": torch.tensor([0, 1, 127, 255], dtype=torch.uint8),
        "scalar": torch.tensor(4.25, dtype=torch.float32),
        "empty": torch.zeros((0, 3), dtype=torch.float32),
    }
    metadata = {"format": "pt", "producer": "make_safetensors_fixture.py"}
    OUT.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(OUT / "reference.safetensors"), metadata=metadata)

    dtype_names = {
        torch.float32: "F32",
        torch.bfloat16: "BF16",
        torch.float64: "F64",
        torch.int64: "I64",
        torch.uint8: "U8",
    }
    expected = {"metadata": metadata, "tensors": []}
    for name, t in tensors.items():
        values = t.float() if t.dtype == torch.bfloat16 else t
        expected["tensors"].append(
            {
                "name": name,
                "dtype": dtype_names[t.dtype],
                "shape": list(t.shape),
                "values": values.flatten().tolist(),
            }
        )
    # repr-exact floats: json writes the shortest string that round-trips a double.
    (OUT / "reference.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()
