"""The generation engine from Python, for scripts that do not want a server."""

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Union

from . import _xmoe


@dataclass
class Generation:
    text: str
    token_ids: List[int] = field(default_factory=list)
    finish_reason: str = ""


class LLM:
    """A Hugging Face MoE checkpoint directory run by xmoe's engine (what `xmoe generate` runs).

    ``LLM(model_dir).generate(prompts, max_tokens=..., temperature=...)`` decodes every prompt together
    (continuous batching) and returns one ``Generation`` (text, token ids, finish reason) per prompt.
    A prompt is a string (tokenized with the checkpoint's tokenizer, special tokens added as `xmoe generate
    --prompt` does) or a list of token ids. Sampling parameters left out take generation_config.json's values.
    """

    def __init__(self, model_dir: str, dtype: str = "bf16", isa: str = ""):
        self._llm = _xmoe.LLM(str(model_dir), dtype, isa)

    def generate(self, prompts: Union[str, Sequence[int], Sequence[Union[str, Sequence[int]]]],
                 max_tokens: int = 256, temperature: Optional[float] = None, seed: Optional[int] = None,
                 ignore_eos: bool = False) -> List[Generation]:
        if isinstance(prompts, str) or (len(prompts) > 0 and isinstance(prompts[0], int)):
            prompts = [prompts]
        items = [p if isinstance(p, str) else [int(t) for t in p] for p in prompts]
        out = self._llm.generate(items, int(max_tokens), temperature, seed, bool(ignore_eos))
        return [Generation(text.decode("utf-8", errors="replace"), list(ids), finish)
                for text, ids, finish in out]
