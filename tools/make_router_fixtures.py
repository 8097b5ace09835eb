#!/usr/bin/python3
"""Reference fixtures for xmoe's LLM routers (src/moe/llm_routing.cpp).

Run with a Python that has PyTorch (written against torch 1.13, Debian python3-torch):
    /usr/bin/python3 tools/make_router_fixtures.py [out_dir]      (default: tests/data/routers)

Each router below is a transcription of the model authors' PyTorch routing code, so the fixtures are an
oracle independent of the C++ implementation:
  qwen3        transformers models/qwen3_moe/modeling_qwen3_moe.py, Qwen3MoeSparseMoeBlock.forward
  deepseek_v3  transformers models/deepseek_v3/modeling_deepseek_v3.py, DeepseekV3TopkRouter
               (get_topk_indices + forward, topk_method "noaux_tc"); the group mask uses -inf as in
               deepseek-ai/DeepSeek-V3 inference/model.py Gate.forward and vLLM's grouped_topk (some
               transformers versions use 0.0, which only differs when every kept score is below 0)
  kimi_k2      the DeepSeek-V3 router (Kimi K2 ships DeepseekV3 modelling code) with n_group = topk_group = 1
  gpt_oss      transformers models/gpt_oss/modeling_gpt_oss.py, GptOssTopKRouter.forward

torch.topk does not promise which of several equal values it returns. Cases whose inputs contain exact
ties are therefore marked "ties" and their selections are made with a stable descending sort, i.e. on
(-score, index), which is the order xmoe guarantees (lower expert index wins). For the random cases the
script checks that both ways of selecting agree.

Floats are written with 9 significant digits, which round-trips every float32 exactly.
"""
import json
import os
import sys

import torch


def pick(scores, k, ties):
    """Indices of the k largest scores along the last dim, in descending order."""
    if ties:
        return torch.sort(scores, dim=-1, descending=True, stable=True)[1][..., :k]
    idx = torch.topk(scores, k, dim=-1, sorted=True)[1]
    stable = torch.sort(scores, dim=-1, descending=True, stable=True)[1][..., :k]
    assert torch.equal(idx, stable), "unexpected tie in a random case; mark it as a tie case"
    return idx


def qwen3(cfg, logits, bias, ties):
    del bias
    routing_weights = torch.nn.functional.softmax(logits, dim=1, dtype=torch.float)
    selected_experts = pick(routing_weights, cfg["top_k"], ties)
    routing_weights = routing_weights.gather(1, selected_experts)
    if cfg["norm_topk_prob"]:
        routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
    return selected_experts, routing_weights


def deepseek_v3(cfg, logits, bias, ties, n_group=None, topk_group=None):
    n_group = cfg["n_group"] if n_group is None else n_group
    topk_group = cfg["topk_group"] if topk_group is None else topk_group
    n_routed_experts = cfg["num_experts"]
    scores = logits.float().sigmoid()
    # get_topk_indices
    scores_for_choice = scores.view(-1, n_routed_experts) + bias.unsqueeze(0)
    group_scores = (
        scores_for_choice.view(-1, n_group, n_routed_experts // n_group).topk(2, dim=-1)[0].sum(dim=-1)
    )
    group_idx = pick(group_scores, topk_group, ties)
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    score_mask = (
        group_mask.unsqueeze(-1).expand(-1, n_group, n_routed_experts // n_group).reshape(-1, n_routed_experts)
    )
    scores_for_choice = scores_for_choice.masked_fill(~score_mask.bool(), float("-inf"))
    # transformers uses sorted=False here; the fixtures list the winners in descending score order.
    topk_indices = pick(scores_for_choice, cfg["top_k"], ties)
    # forward
    topk_weights = scores.gather(1, topk_indices)
    if cfg["norm_topk_prob"]:
        denominator = topk_weights.sum(dim=-1, keepdim=True) + 1e-20
        topk_weights /= denominator
    topk_weights = topk_weights * cfg["routed_scaling_factor"]
    return topk_indices, topk_weights


def kimi_k2(cfg, logits, bias, ties):
    return deepseek_v3(cfg, logits, bias, ties, n_group=1, topk_group=1)


def gpt_oss(cfg, logits, bias, ties):
    del bias
    router_indices = pick(logits, cfg["top_k"], ties)
    router_top_value = logits.gather(1, router_indices)
    router_top_value = torch.nn.functional.softmax(router_top_value, dim=1, dtype=router_top_value.dtype)
    return router_indices, router_top_value


ROUTERS = {"qwen3": qwen3, "deepseek_v3": deepseek_v3, "kimi_k2": kimi_k2, "gpt_oss": gpt_oss}


def f9(values):
    return [float("%.9g" % v) for v in values]


def make_case(gen, name, cfg, tokens, ties=False, logits=None, bias=None):
    cfg = dict(dict(norm_topk_prob=True, n_group=1, topk_group=1, routed_scaling_factor=1.0), **cfg)
    E = cfg["num_experts"]
    if logits is None:
        logits = torch.randn(tokens, E, generator=gen) * 2.0
    uses_bias = cfg["type"] in ("deepseek_v3", "kimi_k2")
    if bias is None:
        bias = torch.randn(E, generator=gen) * 0.1 if uses_bias else torch.zeros(E)
    # Round through the 9-digit text first so the oracle sees exactly the floats C++ will read.
    logits = torch.tensor(f9(logits.flatten().tolist()), dtype=torch.float32).view(tokens, E)
    bias = torch.tensor(f9(bias.tolist()), dtype=torch.float32)
    ids, weights = ROUTERS[cfg["type"]](cfg, logits, bias, ties)
    return {
        "name": name,
        "config": cfg,
        "tokens": tokens,
        "ties": ties,
        "logits": f9(logits.flatten().tolist()),
        "correction_bias": f9(bias.tolist()) if uses_bias else None,
        "ids": ids.flatten().tolist(),
        "weights": f9(weights.flatten().tolist()),
    }


def random_cases(gen):
    out = {"qwen3": [], "deepseek_v3": [], "kimi_k2": [], "gpt_oss": []}
    for E, k, T in [(8, 2, 16), (16, 4, 8), (64, 8, 8), (128, 8, 4), (256, 8, 2), (8, 8, 4), (1, 1, 3)]:
        for norm in (True, False):
            out["qwen3"].append(
                make_case(gen, f"qwen3_E{E}_k{k}_norm{int(norm)}",
                          dict(type="qwen3", num_experts=E, top_k=k, norm_topk_prob=norm), T))
    for E, k, T in [(8, 2, 16), (32, 4, 8), (64, 4, 4), (128, 4, 4), (16, 1, 4)]:
        out["gpt_oss"].append(
            make_case(gen, f"gpt_oss_E{E}_k{k}", dict(type="gpt_oss", num_experts=E, top_k=k), T))
    for E, ng, tg, k, scale, T in [
        (256, 8, 4, 8, 2.5, 4),
        (64, 4, 2, 6, 1.0, 6),
        (64, 8, 3, 5, 1.5, 6),
        (16, 4, 1, 4, 1.0, 8),
        (16, 8, 2, 3, 2.0, 8),
        (8, 1, 1, 2, 1.0, 8),
        (32, 4, 4, 8, 1.0, 4),
    ]:
        for norm in (True, False):
            out["deepseek_v3"].append(
                make_case(gen, f"deepseek_v3_E{E}_g{ng}_tg{tg}_k{k}_norm{int(norm)}",
                          dict(type="deepseek_v3", num_experts=E, top_k=k, norm_topk_prob=norm, n_group=ng,
                               topk_group=tg, routed_scaling_factor=scale), T))
    # Every biased score below 0: here the -inf group mask and the 0.0 mask of some transformers versions
    # disagree (with 0.0 a dropped expert would win), so this pins the -inf behaviour.
    out["deepseek_v3"].append(
        make_case(gen, "deepseek_v3_negative_scores",
                  dict(type="deepseek_v3", num_experts=16, top_k=3, n_group=4, topk_group=2), 6,
                  bias=torch.full((16,), -2.0)))
    # Kimi K2 configs list n_group = topk_group = 1; other values here check that they are ignored.
    for E, k, scale, T, ng, tg in [(384, 8, 2.827, 3, 1, 1), (64, 6, 1.0, 4, 4, 2), (16, 2, 1.0, 8, 1, 1)]:
        for norm in (True, False):
            out["kimi_k2"].append(
                make_case(gen, f"kimi_k2_E{E}_k{k}_norm{int(norm)}",
                          dict(type="kimi_k2", num_experts=E, top_k=k, norm_topk_prob=norm, n_group=ng,
                               topk_group=tg, routed_scaling_factor=scale), T))
    return out


def tie_cases(gen):
    cases = []
    # Logits drawn from a handful of values, so most tokens hold exact ties at the selection boundary.
    for router, E, k in [("qwen3", 16, 4), ("gpt_oss", 16, 4), ("kimi_k2", 16, 4)]:
        logits = torch.randint(-2, 3, (8, E), generator=gen).float() * 0.5
        cases.append(make_case(gen, f"ties_{router}_E{E}_k{k}", dict(type=router, num_experts=E, top_k=k), 8,
                               ties=True, logits=logits, bias=torch.zeros(E)))
    # All-equal logits: the answer must be experts 0..k-1.
    cases.append(make_case(gen, "ties_qwen3_all_equal", dict(type="qwen3", num_experts=8, top_k=3), 2, ties=True,
                           logits=torch.zeros(2, 8)))
    # DeepSeek: identical groups (equal group scores) and ties inside the kept groups; the bias repeats per
    # group so biased scores tie as well.
    E, ng = 32, 4
    base = torch.randint(-1, 2, (6, E // ng), generator=gen).float()
    logits = base.repeat(1, ng)
    bias = (torch.randint(0, 2, (E // ng,), generator=gen).float() * 0.25).repeat(ng)
    cases.append(make_case(gen, "ties_deepseek_v3_equal_groups",
                           dict(type="deepseek_v3", num_experts=E, top_k=5, n_group=ng, topk_group=2,
                                routed_scaling_factor=2.5), 6, ties=True, logits=logits, bias=bias))
    return cases


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                                                                 "routers")
    os.makedirs(out_dir, exist_ok=True)
    gen = torch.Generator().manual_seed(20250611)
    files = random_cases(gen)
    files["ties"] = tie_cases(gen)
    for name, cases in files.items():
        path = os.path.join(out_dir, name + ".json")
        with open(path, "w") as f:
            json.dump({"generator": "tools/make_router_fixtures.py", "torch": torch.__version__, "cases": cases}, f,
                      separators=(",", ":"))
            f.write("\n")
        print(path, len(cases), "cases", os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
