#!/usr/bin/python3
"""Oracle fixtures for the MoE layer (tests/test_layer_oracle.cpp).

Run with Debian's PyTorch: /usr/bin/python3 tools/make_layer_fixtures.py [--check-only]

The layer is implemented densely in plain torch (GShard / einsum style: one-hot dispatch and combine
tensors), in float64, with autograd computing every gradient. Inputs are exactly representable in the
case dtype (float32 values, or bfloat16-rounded values for bfloat16 cases). Before any file is written
the script checks the dense oracle against an independent token-by-token loop implementation, runs
torch.autograd.gradcheck on small float64 cases, checks that the same algorithm run entirely in float32
stays well inside the C++ test's float32 tolerance (conditioning), and estimates the bfloat16 error with a
rounding simulation. Each case is written to tests/data/layer/<name>.safetensors with its config as JSON in
__metadata__["config"].
"""

import argparse
import json
import math
import os
import struct
import sys

import torch

torch.set_default_dtype(torch.float64)

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "layer")

DEFAULTS = dict(
    dtype="float32",
    gate_type="top",
    k=2,
    top_k=2,
    capacity_factor=1.0,
    model_dim=8,
    num_experts=4,
    hidden_size=16,
    output_dim=0,  # 0: model_dim (always resolved before writing)
    expert_type="ffn",
    activation="relu",
    has_fc1_bias=True,
    has_fc2_bias=True,
    proj_dim=8,
    is_postscore=True,
    normalize_gate=True,
    batch_prioritized_routing=False,
    is_gshard_loss=True,
    gate_noise=0.0,
    capacity_alignment=1,
    training=True,
    daux=0.7,
    tokens=16,
)

# Generation-only knobs (not part of the config): skew of the routing towards expert 0, whether the case
# must (True) or must not (False) drop token copies, the cosine gate's temperature.
GEN_KEYS = ("skew", "drops", "temperature", "seed")


# ----------------------------------------------------------------------------------------------------
# Case matrix
# ----------------------------------------------------------------------------------------------------
def build_cases():
    cases = []

    def add(name, **kw):
        c = dict(DEFAULTS)
        c.update(skew=0.0, drops=None, temperature=math.log(2.0), seed=len(cases) * 7919 + 11)
        c.update(kw)
        c["name"] = name
        if c["output_dim"] == 0 or c["expert_type"] == "swiglu":
            c["output_dim"] = c["model_dim"]
        assert set(c) == set(DEFAULTS) | set(GEN_KEYS) | {"name"}, sorted(set(c) ^ set(DEFAULTS))
        cases.append(c)

    def tag(post):
        return "post" if post else "pre"

    # --- capacity modes × k × postscore (top gate, ffn relu) -----------------------------------------
    # cf 1.0 with real drops: T/E small and the routing skewed towards expert 0.
    for k, post in ((1, True), (2, True), (2, False)):
        add(f"f32_top_k{k}_cf1_drops_{tag(post)}", k=k, top_k=k, tokens=12, skew=2.0, drops=True,
            is_postscore=post)
    # k = E: every expert receives every token, so cf 1.0 cannot drop (C = E * ceil(T / E) >= T).
    add("f32_top_k4_cf1_nodrops_post", k=4, top_k=4, tokens=12, skew=2.0, drops=False)
    for k, post in ((1, True), (2, False), (4, True)):
        add(f"f32_top_k{k}_cf0.5_drops_{tag(post)}", k=k, top_k=k, capacity_factor=0.5, drops=True,
            is_postscore=post)
    for k, post in ((1, False), (2, True), (2, False)):
        add(f"f32_top_k{k}_cf0_dropless_{tag(post)}", k=k, top_k=k, capacity_factor=0.0, skew=1.0,
            drops=False, is_postscore=post)
    for k, post in ((1, True), (2, False), (4, True)):
        add(f"f32_top_k{k}_cfm0.5_capped_drops_{tag(post)}", k=k, top_k=k, capacity_factor=-0.5, skew=1.5,
            drops=True, is_postscore=post)
    add("f32_top_k2_cfm2_capped_nobind_post", capacity_factor=-2.0, drops=False)
    # E = 5 (k = E, an odd expert count), T not a multiple of E.
    add("f32_top_e5_k5_cf0.5_drops_post", num_experts=5, k=5, top_k=5, tokens=13, capacity_factor=0.5,
        skew=2.0, drops=True)
    add("f32_top_e5_k2_cf0_dropless_pre", num_experts=5, tokens=23, capacity_factor=0.0, drops=False,
        is_postscore=False)

    # --- cosine gate ------------------------------------------------------------------------------------
    add("f32_cos_k1_cf1_drops_post", gate_type="cosine_top", k=1, top_k=1, tokens=12, skew=2.0, drops=True)
    add("f32_cos_k2_cf1_drops_pre", gate_type="cosine_top", tokens=12, skew=2.0, drops=True,
        is_postscore=False)
    add("f32_cos_k2_cf0_dropless_post", gate_type="cosine_top", capacity_factor=0.0, drops=False)
    add("f32_cos_k4_cfm0.5_capped_pre", gate_type="cosine_top", k=4, top_k=4, capacity_factor=-0.5,
        skew=1.5, drops=True, is_postscore=False)

    # --- experts ----------------------------------------------------------------------------------------
    add("f32_top_k2_cf1_gelu_post", activation="gelu", tokens=12, skew=2.0, drops=True)
    add("f32_top_k2_cf1_silu_pre", activation="silu", tokens=12, skew=2.0, drops=True, is_postscore=False)
    add("f32_top_k2_cf1_nobias_post", has_fc1_bias=False, has_fc2_bias=False, tokens=12, skew=2.0, drops=True)
    add("f32_top_k2_cf0_nofc2bias_pre", has_fc2_bias=False, capacity_factor=0.0, is_postscore=False)
    add("f32_top_k2_cf1_outdim12_post", output_dim=12, tokens=12, skew=2.0, drops=True)
    add("f32_top_k1_cf0_outdim6_pre", k=1, top_k=1, output_dim=6, capacity_factor=0.0, is_postscore=False)
    for post in (True, False):
        add(f"f32_top_k2_cf1_swiglu_drops_{tag(post)}", expert_type="swiglu", tokens=12, skew=2.0, drops=True,
            is_postscore=post)
    add("f32_top_k2_cf0_swiglu_post", expert_type="swiglu", capacity_factor=0.0, drops=False)
    add("f32_cos_k2_cfm0.5_swiglu_pre", gate_type="cosine_top", expert_type="swiglu", capacity_factor=-0.5,
        skew=1.5, drops=True, is_postscore=False)
    add("f32_top_k2_cf1_m12_gelu_post", model_dim=12, activation="gelu", tokens=10, skew=2.0, drops=True)

    # --- batch-prioritized routing ---------------------------------------------------------------------
    add("f32_bpr_k1_cf1_drops_post", batch_prioritized_routing=True, k=1, top_k=1, tokens=12, skew=2.0,
        drops=True)
    add("f32_bpr_k2_cf1_drops_pre", batch_prioritized_routing=True, tokens=12, skew=2.0, drops=True,
        is_postscore=False)
    # Dropless BPR: Tutel's own dispatch_count is wrong here; C must be the true max count.
    add("f32_bpr_k2_cf0_dropless_post", batch_prioritized_routing=True, capacity_factor=0.0, skew=1.0,
        drops=False)
    add("f32_bpr_k2_cfm0.5_capped_post", batch_prioritized_routing=True, capacity_factor=-0.5, skew=1.5,
        drops=True)

    # --- gate options -----------------------------------------------------------------------------------
    add("f32_top_k2_cf1_nonormalize_post", normalize_gate=False, tokens=12, skew=2.0, drops=True)
    add("f32_top_k4_cf0_nonormalize_pre", normalize_gate=False, k=4, top_k=4, capacity_factor=0.0,
        is_postscore=False)
    add("f32_top_k2_percall_topk1_cf1", k=2, top_k=1, tokens=12, skew=2.0, drops=True)
    add("f32_top_k1_percall_topk2_cf0", k=1, top_k=2, capacity_factor=0.0)
    add("f32_top_k2_percall_topk0_means_gate_k", k=2, top_k=0, capacity_factor=0.0)
    add("f32_top_k2_align4_cf1_post", capacity_alignment=4, tokens=12, skew=2.0)
    add("f32_top_k2_align4_cf0_pre", capacity_alignment=4, capacity_factor=0.0, is_postscore=False, tokens=14)

    # --- losses and noise -------------------------------------------------------------------------------
    add("f32_top_k1_importance_load_noise1_cf0", k=1, top_k=1, is_gshard_loss=False, gate_noise=1.0,
        tokens=20, capacity_factor=0.0)
    add("f32_top_k2_importance_load_noise1_cf1_drops_pre", is_gshard_loss=False, gate_noise=1.0, tokens=12,
        skew=2.0, drops=True, is_postscore=False)
    add("f32_cos_k1_importance_load_noise1_cf1", gate_type="cosine_top", k=1, top_k=1, is_gshard_loss=False,
        gate_noise=1.0, tokens=20)
    add("f32_top_k2_gshard_noise1_cf1", gate_noise=1.0, tokens=12, skew=2.0)
    add("f32_bpr_k2_gshard_noise1_cf0", batch_prioritized_routing=True, gate_noise=1.0, capacity_factor=0.0)
    # Eval mode: the stored noise is non-zero on purpose (see build_case); the layer must ignore it.
    add("f32_top_k2_eval_noise_ignored_cf1", training=False, gate_noise=1.0, tokens=12, skew=2.0, drops=True)
    add("f32_cos_k2_eval_importance_load_cf0", gate_type="cosine_top", training=False, gate_noise=1.0,
        is_gshard_loss=False, capacity_factor=0.0)

    # --- bfloat16 ---------------------------------------------------------------------------------------
    add("bf16_top_k2_cf1_drops_post", dtype="bfloat16", tokens=12, skew=2.0, drops=True)
    add("bf16_top_k2_cf1_drops_pre", dtype="bfloat16", tokens=12, skew=2.0, drops=True, is_postscore=False)
    add("bf16_top_k1_cf0_dropless_post", dtype="bfloat16", k=1, top_k=1, capacity_factor=0.0)
    add("bf16_top_k2_cf0_swiglu_pre", dtype="bfloat16", expert_type="swiglu", capacity_factor=0.0,
        is_postscore=False)
    add("bf16_cos_k2_cf1_swiglu_drops_post", dtype="bfloat16", gate_type="cosine_top", expert_type="swiglu",
        tokens=12, skew=2.0, drops=True)
    add("bf16_bpr_k2_cfm0.5_gelu_pre", dtype="bfloat16", batch_prioritized_routing=True, activation="gelu",
        capacity_factor=-0.5, skew=1.5, drops=True, is_postscore=False)

    # --- float64 ----------------------------------------------------------------------------------------
    add("f64_top_k2_cf1_drops_post", dtype="float64", tokens=12, skew=2.0, drops=True)
    add("f64_cos_k2_cf0_swiglu_pre", dtype="float64", gate_type="cosine_top", expert_type="swiglu",
        capacity_factor=0.0, is_postscore=False)
    add("f64_bpr_k4_cfm0.5_gelu_post", dtype="float64", batch_prioritized_routing=True, k=4, top_k=4,
        activation="gelu", capacity_factor=-0.5, skew=1.5, drops=True)
    # Temperature above ln 100: the scale is clamped to 100 and the temperature's gradient is zero. k = 1 so
    # that no ranked score underflows. float64 because a logit scale of 100 saturates the softmax (max scores
    # within 1e-3 of 1), which costs float32 gate gradients ~2e-4 relative (measured with torch in float32).
    add("f64_cos_k1_temp_clamped_post", dtype="float64", gate_type="cosine_top", k=1, top_k=1, temperature=4.8,
        capacity_factor=0.0)
    add("f64_top_k2_importance_load_noise1_silu_pre", dtype="float64", is_gshard_loss=False, gate_noise=1.0,
        activation="silu", is_postscore=False, tokens=20)
    return cases


# ----------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------
def representable(t, dtype):
    """Round a float64 tensor to values exactly representable in the case dtype (returned as float64)."""
    if dtype == "float32":
        return t.float().double()
    if dtype == "bfloat16":
        return t.to(torch.bfloat16).double()
    assert dtype == "float64"
    return t.clone()


def gate_eps(dtype):
    return torch.finfo(torch.float64 if dtype == "float64" else torch.float32).eps


def effective_k(cfg):
    return cfg["top_k"] if cfg["top_k"] > 0 else cfg["k"]


def param_names(cfg):
    if cfg["gate_type"] == "top":
        names = ["gate.wg"]
    else:
        names = ["gate.cosine_projector", "gate.sim_matrix", "gate.temperature"]
    if cfg["expert_type"] == "ffn":
        names += ["experts.batched_fc1_w", "experts.batched_fc2_w"]
        if cfg["has_fc1_bias"]:
            names.append("experts.batched_fc1_bias")
        if cfg["has_fc2_bias"]:
            names.append("experts.batched_fc2_bias")
    else:
        names += ["experts.gate_proj", "experts.up_proj", "experts.down_proj"]
    return names


def make_inputs(cfg, seed):
    """Random parameters and inputs, rounded to the case dtype. Returns (params, x, dy, noise)."""
    g = torch.Generator().manual_seed(seed)
    T, M, E, H, O, P = (cfg["tokens"], cfg["model_dim"], cfg["num_experts"], cfg["hidden_size"],
                        cfg["output_dim"], cfg["proj_dim"])
    dt = cfg["dtype"]

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=g) * std

    def uniform(*shape, bound):
        return (torch.rand(*shape, generator=g) * 2 - 1) * bound

    x = randn(T, M)
    p = {}
    if cfg["gate_type"] == "top":
        wg = randn(E, M, std=1.0 / math.sqrt(M)) * 2.0
        if cfg["skew"] > 0:
            # Skew the routing towards expert 0: shift x along one direction and align expert 0's row with it.
            direction = torch.ones(M) / math.sqrt(M)
            x = x + 0.6 * direction
            wg[0] = wg[0] + cfg["skew"] * direction
        p["gate.wg"] = wg
    else:
        proj = uniform(P, M, bound=1.0 / math.sqrt(M)) * 2.0
        sim = randn(P, E)
        if cfg["skew"] > 0:
            direction = torch.ones(M) / math.sqrt(M)
            x = x + 0.6 * direction
            target = proj @ direction
            sim[:, 0] = sim[:, 0] + cfg["skew"] * 2.0 * target / target.norm()
        p["gate.cosine_projector"] = proj
        p["gate.sim_matrix"] = sim
        p["gate.temperature"] = torch.tensor([cfg["temperature"]])
    if cfg["expert_type"] == "ffn":
        p["experts.batched_fc1_w"] = uniform(E, H, M, bound=1.0 / math.sqrt(M)) * 1.5
        p["experts.batched_fc2_w"] = uniform(E, H, O, bound=1.0 / math.sqrt(H)) * 1.5
        if cfg["has_fc1_bias"]:
            p["experts.batched_fc1_bias"] = randn(E, H, std=0.3)
        if cfg["has_fc2_bias"]:
            p["experts.batched_fc2_bias"] = randn(E, O, std=0.3)
    else:
        p["experts.gate_proj"] = randn(E, H, M, std=1.0 / math.sqrt(M))
        p["experts.up_proj"] = randn(E, H, M, std=1.0 / math.sqrt(M))
        p["experts.down_proj"] = randn(E, M, H, std=1.5 / math.sqrt(H))
    assert list(p) == param_names(cfg)
    p = {n: representable(v, dt) for n, v in p.items()}
    x = representable(x, dt)
    dy = representable(randn(T, O), dt)
    # The layer converts the noise to its compute dtype (float32 for float32/bfloat16 layers).
    noise = randn(T, E).float().double()
    if cfg["gate_noise"] == 0.0:
        noise = torch.zeros(T, E)
    return p, x, dy, noise


# ----------------------------------------------------------------------------------------------------
# Dense oracle
# ----------------------------------------------------------------------------------------------------
def normalize(v, dim):
    """torch.nn.functional.normalize semantics: v / max(||v||_2, 1e-12)."""
    return v / v.norm(dim=dim, keepdim=True).clamp(min=1e-12)


def compute_logits(cfg, p, x, grnd=lambda v: v):
    """Gate logits. `grnd` optionally rounds intermediates (float32 gate simulation)."""
    if cfg["gate_type"] == "top":
        return grnd(x @ p["gate.wg"].t())
    proj = grnd(x @ p["gate.cosine_projector"].t())
    scale = grnd(p["gate.temperature"].clamp(max=math.log(100.0)).exp())
    cos = grnd(grnd(normalize(proj, 1)) @ grnd(normalize(p["gate.sim_matrix"], 0)))
    return grnd(cos * scale)


def act_fn(name):
    return {
        "relu": torch.relu,
        "gelu": lambda h: torch.nn.functional.gelu(h),  # exact erf form
        "silu": torch.nn.functional.silu,
    }[name]


def expert_rows(cfg, p, e, rows, rnd=lambda v: v):
    """Apply expert e to rows [n, M]. `rnd` optionally rounds intermediates (bf16 simulation)."""
    if cfg["expert_type"] == "ffn":
        h = rows @ p["experts.batched_fc1_w"][e].t()
        if cfg["has_fc1_bias"]:
            h = h + p["experts.batched_fc1_bias"][e]
        a = rnd(act_fn(cfg["activation"])(rnd(h)))
        y = a @ p["experts.batched_fc2_w"][e]
        if cfg["has_fc2_bias"]:
            y = y + p["experts.batched_fc2_bias"][e]
        return rnd(y)
    gate = rnd(rows @ p["experts.gate_proj"][e].t())
    up = rnd(rows @ p["experts.up_proj"][e].t())
    a = rnd(torch.nn.functional.silu(gate) * up)
    return rnd(a @ p["experts.down_proj"][e].t())


def route(cfg, scores):
    """Non-differentiable routing: ids [k, T], locations [k, T], counts [E], capacity C (Tutel order)."""
    T, E = scores.shape
    k = effective_k(cfg)
    s = scores.detach()
    ids = torch.topk(s, k, dim=1, largest=True, sorted=True).indices.t().contiguous()  # [k, T]
    masks = [torch.nn.functional.one_hot(ids[j], E).to(torch.int64) for j in range(k)]  # [T, E] each
    if cfg["batch_prioritized_routing"]:
        order = torch.sort(-s.max(dim=1).values, stable=True).indices  # descending max score, stable
    else:
        order = torch.arange(T)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(T)
    locations = torch.empty(k, T, dtype=torch.int64)
    base = torch.zeros(E, dtype=torch.int64)
    for j in range(k):
        cum = torch.cumsum(masks[j][order], dim=0)[inverse] - 1 + base  # [T, E] in original token order
        locations[j] = cum.gather(1, ids[j].view(-1, 1)).view(-1)
        base = base + masks[j].sum(0)
    counts = base
    spe = -(-T // E)
    cf = cfg["capacity_factor"]
    if cf > 0:
        cap = k * int(cf * spe)
    elif cf == 0:
        cap = int(counts.max())
    else:
        cap = min(int(counts.max()), k * int(-cf * spe))
    a = cfg["capacity_alignment"]
    cap = (cap + a - 1) // a * a
    return ids, locations, counts, cap


def forward_dense(cfg, p, x, noise, rnd=lambda v: v, grnd=lambda v: v):
    """Dense GShard-style forward. Returns (y, aux_loss, routing dict). `rnd` / `grnd` optionally round the
    expert-path / gate-path intermediates (rounding simulations)."""
    T, M = x.shape
    E = cfg["num_experts"]
    k = effective_k(cfg)
    logits = compute_logits(cfg, p, x, grnd)
    use_noise = cfg["training"] and cfg["gate_noise"] > 0
    noisy = grnd(logits + cfg["gate_noise"] * noise / E) if use_noise else logits
    scores = grnd(torch.softmax(noisy, dim=1))
    ids, locations, counts, cap = route(cfg, scores)
    gates = [scores.gather(1, ids[j].view(-1, 1)).view(-1) for j in range(k)]
    if cfg["normalize_gate"] and k > 1:
        denom = torch.stack(gates).sum(0).clamp(min=gate_eps(cfg["dtype"]))
        gates = [grnd(g / denom) for g in gates]
    kept = locations < cap
    # One-hot dispatch tensors D_j [T, E, C].
    disp = []
    for j in range(k):
        d = torch.zeros(T, E, max(cap, 1))
        t_idx = torch.arange(T)[kept[j]]
        d[t_idx, ids[j][kept[j]], locations[j][kept[j]]] = 1.0
        disp.append(d[:, :, :cap])
    post = cfg["is_postscore"]
    enc_w = sum(disp[j] * (1.0 if post else gates[j].view(T, 1, 1)) for j in range(k))
    Z = rnd(torch.einsum("tec,tm->ecm", enc_w, x))
    Y = torch.stack([expert_rows(cfg, p, e, Z[e], rnd) for e in range(E)])  # [E, C, O]
    dec_w = sum(disp[j] * (gates[j].view(T, 1, 1) if post else 1.0) for j in range(k))
    y = rnd(torch.einsum("tec,eco->to", dec_w, Y))
    # Aux loss.
    if cfg["is_gshard_loss"]:
        count1 = torch.nn.functional.one_hot(ids[0], E).sum(0).to(scores.dtype)
        aux = E / (T * T) * (scores.sum(0) * count1).sum()
    else:
        assert cfg["gate_noise"] > 0
        clean = grnd(torch.softmax(logits, dim=1))
        imp = clean.sum(0)
        l_imp = imp.var() / (imp.mean() ** 2 + 1e-10)
        thr = noisy.gather(1, ids[k - 1].view(-1, 1))
        sigma = cfg["gate_noise"] / E
        load = grnd(0.5 * (1.0 + torch.erf(grnd((clean - thr) / (sigma * math.sqrt(2.0)))))).sum(0)
        l_load = load.var() / (load.mean() ** 2 + 1e-10)
        aux = (l_imp + l_load) / 2
    routing = dict(ids=ids, locations=locations, counts=counts, capacity=cap, scores=scores.detach(),
                   noisy=noisy.detach(),
                   dropped=int((~kept).sum()))
    return y, aux, routing


def forward_loop(cfg, p, x, noise):
    """Independent token-by-token implementation: sequential per-expert counters, explicit slot table."""
    T, M = x.shape
    E = cfg["num_experts"]
    k = effective_k(cfg)
    out_dim = cfg["output_dim"]
    rows_y = []
    logits_rows, noisy_rows, score_rows = [], [], []
    use_noise = cfg["training"] and cfg["gate_noise"] > 0
    for t in range(T):
        xt = x[t:t + 1]
        lt = compute_logits(cfg, p, xt)[0]
        nt = lt + cfg["gate_noise"] * noise[t] / E if use_noise else lt
        logits_rows.append(lt)
        noisy_rows.append(nt)
        score_rows.append(torch.exp(nt - nt.max()) / torch.exp(nt - nt.max()).sum())
    # Choices per token by repeated arg-max.
    choice = []
    for t in range(T):
        s = score_rows[t].detach().tolist()
        picked = []
        for _ in range(k):
            best = max((e for e in range(E) if e not in picked), key=lambda e: s[e])
            picked.append(best)
        choice.append(picked)
    order = list(range(T))
    if cfg["batch_prioritized_routing"]:
        order.sort(key=lambda t: (-max(score_rows[t].detach().tolist()), t))
    counter = [0] * E
    loc = [[0] * T for _ in range(k)]
    for j in range(k):
        for t in order:
            e = choice[t][j]
            loc[j][t] = counter[e]
            counter[e] += 1
    spe = math.ceil(T / E)
    cf = cfg["capacity_factor"]
    if cf > 0:
        cap = k * math.floor(cf * spe)
    elif cf == 0:
        cap = max(counter)
    else:
        cap = min(max(counter), k * math.floor(-cf * spe))
    a = cfg["capacity_alignment"]
    cap = math.ceil(cap / a) * a
    # Slot table: (e, c) -> list of (t, j).
    slot = {}
    for j in range(k):
        for t in range(T):
            if loc[j][t] < cap:
                slot.setdefault((choice[t][j], loc[j][t]), []).append((t, j))
    gates = []
    for t in range(T):
        gs = [score_rows[t][choice[t][j]] for j in range(k)]
        if cfg["normalize_gate"] and k > 1:
            total = sum(gs)
            total = total.clamp(min=gate_eps(cfg["dtype"]))
            gs = [g / total for g in gs]
        gates.append(gs)
    post = cfg["is_postscore"]
    expert_out = {}
    for e in range(E):
        for c in range(cap):
            z = torch.zeros(M)
            for (t, j) in slot.get((e, c), []):
                z = z + (1.0 if post else gates[t][j]) * x[t]
            expert_out[(e, c)] = expert_rows(cfg, p, e, z.view(1, M))[0]
    for t in range(T):
        yt = torch.zeros(out_dim)
        for j in range(k):
            if loc[j][t] < cap:
                yt = yt + (gates[t][j] if post else 1.0) * expert_out[(choice[t][j], loc[j][t])]
        rows_y.append(yt)
    y = torch.stack(rows_y)
    scores = torch.stack(score_rows)
    if cfg["is_gshard_loss"]:
        aux = 0.0
        for e in range(E):
            first = sum(1 for t in range(T) if choice[t][0] == e)
            aux = aux + scores[:, e].sum() * first
        aux = aux * E / (T * T)
    else:
        sigma = cfg["gate_noise"] / E
        imp = [sum(torch.softmax(logits_rows[t], 0)[e] for t in range(T)) for e in range(E)]
        load = [sum(0.5 * (1 + torch.erf((torch.softmax(logits_rows[t], 0)[e] - noisy_rows[t][choice[t][k - 1]])
                                          / (sigma * math.sqrt(2)))) for t in range(T)) for e in range(E)]

        def cv2(v):
            v = torch.stack(v)
            mean = v.sum() / E
            var = ((v - mean) ** 2).sum() / (E - 1)
            return var / (mean ** 2 + 1e-10)

        aux = (cv2(imp) + cv2(load)) / 2
    routing = dict(ids=torch.tensor([[choice[t][j] for t in range(T)] for j in range(k)]),
                   locations=torch.tensor(loc), counts=torch.tensor(counter), capacity=cap)
    return y, aux, routing


def run_with_grads(fwd, cfg, p, x, dy, noise):
    """Forward + backward of sum(y * dy) + daux * aux. Returns (y, aux, routing, dx, grads)."""
    pv = {n: v.clone().requires_grad_(True) for n, v in p.items()}
    xv = x.clone().requires_grad_(True)
    y, aux, routing = fwd(cfg, pv, xv, noise)
    total = (y * dy).sum() + cfg["daux"] * aux
    params = list(pv.values())
    grads = torch.autograd.grad(total, [xv] + params, allow_unused=True)
    dx = grads[0]
    pg = {}
    for (n, v), g in zip(pv.items(), grads[1:]):
        pg[n] = torch.zeros_like(v) if g is None else g
    return y.detach(), float(aux), routing, dx, pg


# ----------------------------------------------------------------------------------------------------
# Case validity: no ties, margins large enough for a float32 gate, required drops
# ----------------------------------------------------------------------------------------------------
def margin_ok(cfg, routing):
    """The layer ranks float32 (or float64) scores; softmax is monotone in the noisy logits, so a gap of
    1e-3 between consecutive ranked noisy logits (down to rank k+1) keeps its top-k identical to ours, as
    long as no ranked score underflows in float32. BPR also ranks tokens by their max score."""
    logits = routing["noisy"]
    s = routing["scores"]
    k = effective_k(cfg)
    E = s.shape[1]
    upto = min(k + 1, E)
    srt = torch.sort(logits, dim=1, descending=True).values
    gaps = srt[:, :upto - 1] - srt[:, 1:upto]
    if gaps.numel() and float(gaps.min()) < 1e-3:
        return False
    if float(torch.sort(s, dim=1, descending=True).values[:, upto - 1].min()) < 1e-30:
        return False
    if cfg["batch_prioritized_routing"]:
        mx = torch.sort(s.max(dim=1).values).values
        if float((mx[1:] - mx[:-1]).min()) < 2e-5:
            return False
    return True


def drops_ok(cfg, routing):
    if cfg["drops"] is None:
        return True
    return (routing["dropped"] > 0) == cfg["drops"]


def build_case(cfg):
    for attempt in range(200):
        seed = cfg["seed"] + attempt * 100003
        p, x, dy, noise = make_inputs(cfg, seed)
        if cfg["name"].startswith("f32_top_k2_eval_noise_ignored"):
            # Give the eval case non-zero noise so that a layer which applies it fails.
            noise = torch.randn(x.shape[0], cfg["num_experts"],
                                generator=torch.Generator().manual_seed(seed + 1)).float().double()
        with torch.no_grad():
            _, _, routing = forward_dense(cfg, p, x, noise)
        if margin_ok(cfg, routing) and drops_ok(cfg, routing):
            return seed, p, x, dy, noise
    raise RuntimeError(f"{cfg['name']}: no seed gives untied routing with the required drops")


# ----------------------------------------------------------------------------------------------------
# Self checks
# ----------------------------------------------------------------------------------------------------
def rel(a, b):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).abs().max() / max(float(b.abs().max()), 1e-300))


def check_against_loop(cfg, p, x, dy, noise):
    yd, ad, rd, dxd, gd = run_with_grads(forward_dense, cfg, p, x, dy, noise)
    yl, al, rl, dxl, gl = run_with_grads(forward_loop, cfg, p, x, dy, noise)
    assert torch.equal(rd["ids"], rl["ids"]), cfg["name"]
    assert torch.equal(rd["locations"], rl["locations"]), cfg["name"]
    assert torch.equal(rd["counts"], rl["counts"]), cfg["name"]
    assert rd["capacity"] == rl["capacity"], cfg["name"]
    worst = max([rel(yd, yl), abs(ad - al) / max(abs(al), 1e-300), rel(dxd, dxl)] +
                [rel(gd[n], gl[n]) if float(gl[n].abs().max()) > 0 else float(gd[n].abs().max())
                 for n in gd])
    assert worst < 1e-12, (cfg["name"], worst)
    return worst


def check_gradcheck(cfg, p, x, noise):
    names = list(p)

    def fn(xv, *pv):
        y, aux, _ = forward_dense(cfg, dict(zip(names, pv)), xv, noise)
        return y, aux.view(1)

    inputs = [x.clone().requires_grad_(True)] + [p[n].clone().requires_grad_(True) for n in names]
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5), cfg["name"]


class _RoundBF16(torch.autograd.Function):
    """Rounds to bfloat16 in forward and the incoming gradient in backward."""

    @staticmethod
    def forward(ctx, v):
        return v.to(torch.bfloat16).double()

    @staticmethod
    def backward(ctx, g):
        return g.to(torch.bfloat16).double()


class _RoundF32(torch.autograd.Function):
    @staticmethod
    def forward(ctx, v):
        return v.float().double()

    @staticmethod
    def backward(ctx, g):
        return g.float().double()


def simulated_error(cfg, p, x, dy, noise, rounder):
    """Largest relative error over all expectations when intermediates are rounded by `rounder`."""
    ref = run_with_grads(forward_dense, cfg, p, x, dy, noise)

    def fwd(c, pv, xv, nz):
        return forward_dense(c, pv, xv, nz, rnd=rounder.apply, grnd=_RoundF32.apply)

    sim = run_with_grads(fwd, cfg, p, x, dy, noise)
    errs = {"y": rel(sim[0], ref[0]), "aux": abs(sim[1] - ref[1]) / abs(ref[1]), "dx": rel(sim[3], ref[3])}
    for n in ref[4]:
        if float(ref[4][n].abs().max()) > 0:
            errs["grad." + n] = rel(sim[4][n], ref[4][n])
    return errs


def float32_run_error(cfg, p, x, dy, noise):
    """Largest relative error over all expectations of the oracle computed entirely in float32."""
    ref = run_with_grads(forward_dense, cfg, p, x, dy, noise)
    torch.set_default_dtype(torch.float32)
    try:
        sim = run_with_grads(forward_dense, cfg, {n: v.float() for n, v in p.items()}, x.float(), dy.float(),
                             noise.float())
    finally:
        torch.set_default_dtype(torch.float64)
    errs = {"y": rel(sim[0], ref[0]), "aux": abs(sim[1] - ref[1]) / abs(ref[1]), "dx": rel(sim[3], ref[3])}
    for n in ref[4]:
        if float(ref[4][n].abs().max()) > 0:
            errs["grad." + n] = rel(sim[4][n], ref[4][n])
    return errs


# ----------------------------------------------------------------------------------------------------
# safetensors writer
# ----------------------------------------------------------------------------------------------------
ST_DTYPES = {"float32": ("F32", torch.float32), "bfloat16": ("BF16", torch.bfloat16),
             "float64": ("F64", torch.float64)}


def tensor_bytes(t, dtype):
    t = t.detach().contiguous()
    if dtype == "bfloat16":
        # Exact: the values are already bf16-representable; take the upper 16 bits of the f32 pattern.
        bits = t.float().view(torch.int32).bitwise_right_shift(16).to(torch.int16)
        data = bits.numpy().astype("<i2").tobytes()
        return data
    np_t = t.to(ST_DTYPES[dtype][1]).numpy()
    return np_t.astype("<f4" if dtype == "float32" else "<f8").tobytes()


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, float64 tensor, dtype name). Written with 8-byte elements first so every
    tensor is naturally aligned and the data section has no holes."""
    size = {"float64": 8, "float32": 4, "bfloat16": 2}
    ordered = sorted(tensors, key=lambda item: -size[item[2]])
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name, t, dt in ordered:
        b = tensor_bytes(t, dt)
        assert len(b) == t.numel() * size[dt]
        header[name] = {"dtype": ST_DTYPES[dt][0], "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def read_safetensors(path):
    """Minimal reader used to re-check what was written."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__")
    data = raw[8 + n:]
    out = {}
    for name, h in header.items():
        b, e = h["data_offsets"]
        chunk = bytearray(data[b:e])
        if h["dtype"] == "BF16":
            t = torch.frombuffer(chunk, dtype=torch.int16).to(torch.int32).bitwise_left_shift(16)
            t = t.view(torch.float32).double()
        else:
            t = torch.frombuffer(chunk, dtype=torch.float32 if h["dtype"] == "F32" else torch.float64).double()
        out[name] = t.reshape(h["shape"]) if h["shape"] else t
    return meta, out


def case_tensors(cfg, p, x, dy, noise):
    y, aux, routing, dx, grads = run_with_grads(forward_dense, cfg, p, x, dy, noise)
    dt = cfg["dtype"]
    items = [("param." + n, v, dt) for n, v in p.items()]
    items += [("input.x", x, dt), ("input.dy", dy, dt), ("input.noise", noise, "float64"),
              ("expect.y", y, "float64"), ("expect.aux_loss", torch.tensor([aux]), "float64"),
              ("expect.dx", dx, "float64")]
    items += [("expect.grad." + n, g, "float64") for n, g in grads.items()]
    items += [("expect.capacity", torch.tensor([float(routing["capacity"])]), "float64"),
              ("expect.counts", routing["counts"].double(), "float64"),
              ("expect.ids", routing["ids"].double(), "float64"),
              ("expect.locations", routing["locations"].double(), "float64")]
    return items, routing


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-only", action="store_true", help="run the self checks, write nothing")
    args = ap.parse_args()
    cases = build_cases()
    names = [c["name"] for c in cases]
    assert len(set(names)) == len(names)
    built = {}
    for cfg in cases:
        built[cfg["name"]] = build_case(cfg)

    # 0) The activations are the intended closed forms (shared by both implementations below).
    h = torch.linspace(-6, 6, 241)
    assert torch.allclose(act_fn("gelu")(h), 0.5 * h * (1 + torch.erf(h / math.sqrt(2))), rtol=0, atol=1e-15)
    assert torch.allclose(act_fn("silu")(h), h / (1 + torch.exp(-h)), rtol=0, atol=1e-15)
    assert torch.equal(act_fn("relu")(h), torch.where(h > 0, h, torch.zeros_like(h)))

    # 1) Dense oracle == independent loop implementation (values, routing, gradients) on every case.
    worst = 0.0
    for cfg in cases:
        _, p, x, dy, noise = built[cfg["name"]]
        worst = max(worst, check_against_loop(cfg, p, x, dy, noise))
    print(f"dense vs loop: {len(cases)} cases agree, worst relative difference {worst:.2e}")

    # 2) gradcheck on small float64 cases (finite differences vs autograd, through gates and experts).
    gc_names = ["f64_top_k2_cf1_drops_post", "f64_cos_k2_cf0_swiglu_pre", "f64_bpr_k4_cfm0.5_gelu_post",
                "f64_top_k2_importance_load_noise1_silu_pre", "f64_cos_k1_temp_clamped_post"]
    for cfg in cases:
        if cfg["name"] in gc_names:
            _, p, x, _, noise = built[cfg["name"]]
            check_gradcheck(cfg, p, x, noise)
    print(f"gradcheck passed on {len(gc_names)} float64 cases")

    # 3) Conditioning: the same dense oracle run entirely in float32 by torch must stay well inside the float32
    #    tolerance of the C++ test on every float32 case.
    worst_case = ("", "", 0.0)
    for cfg in cases:
        if cfg["dtype"] != "float32":
            continue
        _, p, x, dy, noise = built[cfg["name"]]
        for key, err in float32_run_error(cfg, p, x, dy, noise).items():
            if err > worst_case[2]:
                worst_case = (cfg["name"], key, err)
    print(f"float32 torch run: worst relative error {worst_case[2]:.2e} ({worst_case[0]}: {worst_case[1]})")
    assert worst_case[2] < 1e-5 / 3, worst_case

    # 4) Rounding simulations: float32 and bfloat16 intermediates against the float64 oracle.
    for dtype, rounder, tol in (("float32", _RoundF32, 1e-5), ("bfloat16", _RoundBF16, 3e-2)):
        worst_case = ("", "", 0.0)
        for cfg in cases:
            if cfg["dtype"] != dtype:
                continue
            _, p, x, dy, noise = built[cfg["name"]]
            for key, err in simulated_error(cfg, p, x, dy, noise, rounder).items():
                if err > worst_case[2]:
                    worst_case = (cfg["name"], key, err)
        print(f"{dtype} rounding simulation: worst relative error {worst_case[2]:.2e} "
              f"({worst_case[0]}: {worst_case[1]}), tolerance {tol:g}")
        assert worst_case[2] < tol / 3, worst_case

    if args.check_only:
        return
    os.makedirs(OUT_DIR, exist_ok=True)
    for f in os.listdir(OUT_DIR):
        if f.endswith(".safetensors"):
            os.remove(os.path.join(OUT_DIR, f))
    total = 0
    summary = []
    for cfg in cases:
        seed, p, x, dy, noise = built[cfg["name"]]
        items, routing = case_tensors(cfg, p, x, dy, noise)
        config = {key: cfg[key] for key in ["name"] + list(DEFAULTS)}
        path = os.path.join(OUT_DIR, cfg["name"] + ".safetensors")
        write_safetensors(path, items, {"config": json.dumps(config, sort_keys=True)})
        meta, back = read_safetensors(path)
        assert json.loads(meta["config"]) == config
        for name, t, _ in items:
            assert torch.equal(back[name], t.double().reshape(back[name].shape)), (cfg["name"], name)
        size = os.path.getsize(path)
        total += size
        summary.append(f"{cfg['name']:48s} {size:7d} B  C={routing['capacity']:3d} "
                       f"dropped={routing['dropped']:3d} counts={routing['counts'].tolist()}")
    print("\n".join(summary))
    print(f"{len(cases)} cases, {total} bytes in {os.path.normpath(OUT_DIR)}")
    assert total < 2 * 1024 * 1024


if __name__ == "__main__":
    sys.exit(main())
