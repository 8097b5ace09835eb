"""xmoe from Python: ``xmoe.moe.moe_layer`` (a drop-in for ``tutel.moe.moe_layer``) and ``xmoe.LLM``."""

from ._xmoe import c_api_version  # noqa: F401
from .llm import LLM  # noqa: F401

__all__ = ["LLM", "moe"]


def __getattr__(name):
    # `xmoe.moe` needs torch; import it only when asked for.
    if name == "moe":
        import importlib
        return importlib.import_module(".moe", __name__)
    raise AttributeError(name)
