"""Shared helpers: the dense PyTorch formulation of Tutel's layer (tools/make_layer_fixtures.py) as the oracle,
and the xmoe CLI for the end-to-end comparisons."""

import contextlib
import importlib.util
import os
import shutil

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _load_oracle():
    path = os.path.join(ROOT, "tools", "make_layer_fixtures.py")
    spec = importlib.util.spec_from_file_location("layer_oracle", path)
    module = importlib.util.module_from_spec(spec)
    previous = torch.get_default_dtype()
    spec.loader.exec_module(module)  # it sets float64 as the default dtype
    torch.set_default_dtype(previous)
    return module


oracle = _load_oracle()


@contextlib.contextmanager
def float64_default():
    """The oracle builds its dense tensors in the default dtype, which must be float64."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def xmoe_cli():
    """The xmoe binary: $XMOE_CLI, else build/xmoe of this checkout, else skip."""
    path = os.environ.get("XMOE_CLI") or os.path.join(ROOT, "build", "xmoe")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        path = shutil.which("xmoe")
    if not path:
        pytest.fail("the xmoe CLI is not built: build it (cmake --build build) or set XMOE_CLI")
    return path
