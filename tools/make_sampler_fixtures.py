#!/usr/bin/env python3
"""Reference fixtures for xmoe's sampler (src/llm/sampler.cpp).

Run with the oracle virtualenv (torch + transformers):
    /work/oracle-venv/bin/python tools/make_sampler_fixtures.py [out_dir]      (default: tests/data/sampler)

Each case draws random logits and pushes them through transformers' own logits processors in the order
generate() builds them (generation/utils.py, _get_logits_processor):
    RepetitionPenaltyLogitsProcessor -> TemperatureLogitsWarper -> TopKLogitsWarper -> TopPLogitsWarper
    -> MinPLogitsWarper
then records softmax of the result: the probability of every token (0 for the filtered ones).
transformers has no presence/frequency penalty; for those the OpenAI formula (as vLLM's apply_penalties does it,
after the repetition penalty) is written out below:  logit -= frequency * count + presence * (count > 0)
over the generated tokens.

Greedy cases (temperature 0) record the argmax after the penalties, as generate(do_sample=False) picks it.

Cases where a token sits within a hair of a top-p or min-p threshold (where float32 rounding in torch and
the double arithmetic in xmoe could legitimately disagree) are redrawn, so the fixture tests semantics, not
rounding.
"""
import json
import os
import sys

import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

VOCAB = 48

CASES = [
    # name, params (unset = off)
    ("plain", {}),
    ("temperature_0.7", {"temperature": 0.7}),
    ("temperature_1.8", {"temperature": 1.8}),
    ("top_k_5", {"top_k": 5}),
    ("top_k_1", {"top_k": 1}),
    ("top_k_vocab", {"top_k": VOCAB + 3}),
    ("top_p_0.9", {"top_p": 0.9}),
    ("top_p_0.5_t0.6", {"top_p": 0.5, "temperature": 0.6}),
    ("top_p_0.05", {"top_p": 0.05}),
    ("min_p_0.1", {"min_p": 0.1}),
    ("min_p_0.3_t1.5", {"min_p": 0.3, "temperature": 1.5}),
    ("top_k_top_p", {"top_k": 12, "top_p": 0.8}),
    ("all_filters", {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "min_p": 0.05}),
    ("repetition_1.3", {"repetition_penalty": 1.3}),
    ("repetition_0.7", {"repetition_penalty": 0.7}),
    ("repetition_top_p", {"repetition_penalty": 1.5, "top_p": 0.7, "temperature": 0.9}),
    ("presence", {"presence_penalty": 0.8}),
    ("frequency", {"frequency_penalty": 0.5}),
    ("negative_presence", {"presence_penalty": -1.0, "frequency_penalty": 0.25}),
    ("everything", {"repetition_penalty": 1.2, "presence_penalty": 0.4, "frequency_penalty": 0.3,
                    "temperature": 0.75, "top_k": 30, "top_p": 0.95, "min_p": 0.02}),
    ("greedy", {"temperature": 0.0}),
    ("greedy_repetition", {"temperature": 0.0, "repetition_penalty": 3.0}),
    ("greedy_penalties", {"temperature": 0.0, "presence_penalty": 2.0, "frequency_penalty": 1.5}),
]


def penalized(logits, p, prompt, output):
    scores = logits.clone()[None, :]
    if p.get("repetition_penalty", 1.0) != 1.0:
        ids = torch.tensor([prompt + output], dtype=torch.long)
        scores = RepetitionPenaltyLogitsProcessor(p["repetition_penalty"])(ids, scores)
    counts = torch.zeros(VOCAB)
    for t in output:
        counts[t] += 1
    scores = scores - p.get("frequency_penalty", 0.0) * counts - p.get("presence_penalty", 0.0) * (counts > 0)
    return scores


def borderline(scores, p):
    """True when a token is within rounding distance of the top-p or min-p threshold."""
    probs = scores.softmax(-1)[0].double()
    if p.get("top_p", 1.0) < 1.0:
        asc = torch.sort(probs)[0].cumsum(-1)
        if (asc - (1 - p["top_p"])).abs().min() < 1e-4:
            return True
    if p.get("min_p", 0.0) > 0.0:
        if (probs - p["min_p"] * probs.max()).abs().min() < 1e-6:
            return True
    return False


def make_case(gen, name, p):
    while True:
        logits = (torch.randn(VOCAB, generator=gen) * 1.2).float()
        prompt = torch.randint(0, VOCAB, (10,), generator=gen).tolist()
        output = torch.randint(0, VOCAB, (7,), generator=gen).tolist()
        if p.get("temperature", 1.0) == 0.0 and len(p) > 1:
            output[0] = int(logits.argmax())  # so the penalty has to move the argmax's logit
        scores = penalized(logits, p, prompt, output)
        case = {"name": name, "params": p, "logits": [float(f"{x:.9g}") for x in logits.tolist()],
                "prompt": prompt, "output": output}
        if p.get("temperature", 1.0) == 0.0:
            case["greedy_token"] = int(scores[0].argmax())
            return case
        dummy_ids = torch.tensor([prompt + output], dtype=torch.long)
        if "temperature" in p:
            scores = TemperatureLogitsWarper(p["temperature"])(dummy_ids, scores)
        if p.get("top_k", 0) > 0:
            scores = TopKLogitsWarper(p["top_k"])(dummy_ids, scores)
        if p.get("top_p", 1.0) < 1.0:
            if borderline(scores, p):
                continue
            scores = TopPLogitsWarper(p["top_p"])(dummy_ids, scores)
        if p.get("min_p", 0.0) > 0.0:
            if borderline(scores, p):
                continue
            scores = MinPLogitsWarper(p["min_p"])(dummy_ids, scores)
        probs = scores.softmax(-1)[0]
        case["probs"] = [float(f"{x:.9g}") for x in probs.tolist()]
        return case


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests",
                                                                 "data", "sampler")
    os.makedirs(out_dir, exist_ok=True)
    gen = torch.Generator().manual_seed(20261202)
    cases = [make_case(gen, name, p) for name, p in CASES]
    with open(os.path.join(out_dir, "processors.json"), "w") as f:
        json.dump({"vocab": VOCAB, "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
