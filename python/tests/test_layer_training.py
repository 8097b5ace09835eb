"""gradcheck in float64, torch.optim steps against `xmoe bench`, Tutel's state_dict layout and loading rules,
per-call switches and clear errors."""

import re
import subprocess

import pytest
import torch

from conftest import float64_default, oracle, xmoe_cli
import xmoe
from xmoe import moe as tutel_moe


def small_layer(dtype=torch.float64, gate="top", expert_type="ffn", **kw):
    gate_type = {"type": gate, "k": 2, "capacity_factor": 1.0}
    if gate == "cosine_top":
        gate_type["proj_dim"] = 8
    experts = {"type": expert_type, "count_per_node": 4, "hidden_size_per_expert": 6}
    if expert_type == "ffn":
        experts["activation_fn"] = torch.nn.functional.gelu
    return tutel_moe.moe_layer(gate_type=gate_type, model_dim=8, experts=experts, seeds=(3, 4, 5), **kw).to(dtype)


@pytest.mark.parametrize("gate,expert_type,cf,postscore", [("top", "ffn", 1.0, True), ("cosine_top", "swiglu", 0.0, False),
                                                       ("top", "ffn", -0.5, False)])
def test_gradcheck_float64(gate, expert_type, cf, postscore):
    layer = small_layer(gate=gate, expert_type=expert_type, is_postscore=postscore)
    names = [n for n, _ in layer.named_parameters()]
    params = [p.detach().clone().requires_grad_(True) for p in layer.parameters()]
    x = torch.randn(12, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(7)).requires_grad_(True)

    # torch.func.functional_call (torch 2) or its torch 1.13 predecessor: the layer runs on `ps`.
    functional_call = torch.func.functional_call if hasattr(torch, "func") else \
        torch.nn.utils.stateless.functional_call

    def fn(x, *ps):
        y = functional_call(layer, dict(zip(names, ps)), (x,), {"capacity_factor": cf})
        return y, y.l_aux.view(1)

    assert torch.autograd.gradcheck(fn, [x] + params, eps=1e-6, atol=1e-7, rtol=1e-5)


def bench_losses(args):
    out = subprocess.run([xmoe_cli(), "bench"] + args, check=True, capture_output=True, text=True).stdout
    return [float(v) for v in re.findall(r"STEP-\d+: loss = ([-0-9.e]+)", out)]


@pytest.mark.parametrize("optimizer,lr,dtype,extra", [("sgd", 0.05, "float32", []),
                                                      ("adam", 1e-3, "float32", []),
                                                      ("sgd", 0.05, "float64", ["--capacity_factor", "0"]),
                                                      ("sgd", 0.05, "float32", ["--expert_type", "swiglu",
                                                                               "--l_aux_wt", "0.5"])])
def test_optimizer_steps_equal_xmoe_bench(optimizer, lr, dtype, extra):
    B, T, M, H, E, steps, seed = 2, 16, 16, 24, 2, 4, 11
    args = ["--batch_size", str(B), "--num_tokens", str(T), "--model_dim", str(M), "--hidden_size", str(H),
            "--num_local_experts", str(E), "--top", "2", "--num_steps", str(steps), "--seed", str(seed),
            "--lr", str(lr), "--optimizer", optimizer, "--dtype", dtype, "--threads", "1"] + extra
    expected = bench_losses(args)
    assert len(expected) == steps
    opts = dict(zip(extra[::2], extra[1::2]))
    cf = float(opts.get("--capacity_factor", 1.0))
    expert_type = opts.get("--expert_type", "ffn")
    l_aux_wt = float(opts.get("--l_aux_wt", 0.0))
    dt = {"float32": torch.float32, "float64": torch.float64}[dtype]
    # xmoe bench's layer: seeds 1/1, top gate; its input: xmoe's counter-based normal draws (seed, rank 0).
    experts = {"type": expert_type, "count_per_node": E, "hidden_size_per_expert": H}
    if expert_type == "ffn":
        experts["activation_fn"] = lambda v: torch.nn.functional.relu(v)
    layer = tutel_moe.moe_layer(gate_type={"type": "top", "k": 2, "capacity_factor": cf, "fp32_gate": True},
                                model_dim=M, experts=experts, seeds=(1, 1, 1)).to(dt)
    x = torch.empty(B, T, M, dtype=dt)
    xmoe._xmoe.fill_normal(seed, 0, x)
    opt = torch.optim.SGD(layer.parameters(), lr=lr) if optimizer == "sgd" else \
        torch.optim.Adam(layer.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        y = layer(x)
        out = torch.log_softmax(torch.sum(y, dim=2), dim=1)
        loss = torch.nn.functional.nll_loss(out, torch.zeros(B, dtype=torch.long)) + l_aux_wt * y.l_aux
        loss.backward()
        opt.step()
        losses.append(float(loss))
    # bench prints %.5f; the head runs in float64 there and in the layer's dtype here.
    assert max(abs(a - b) for a, b in zip(losses, expected)) <= 3e-5, (losses, expected)
    assert losses[0] != losses[-1]  # the steps changed the layer


def tutel_state_shapes(E, M, H, O, gate="top", P=256, fc1_bias=True, fc2_bias=True):
    """The state_dict Tutel's moe_layer creates (one process, E local experts)."""
    shapes = {"gates.0.wg.weight": (E, M)} if gate == "top" else {
        "gates.0.temperature": (1,), "gates.0.cosine_projector.weight": (P, M), "gates.0.sim_matrix": (P, E)}
    shapes.update({"experts.batched_fc1_w": (E, H, M), "experts.batched_fc2_w": (E, H, O)})
    if fc1_bias:
        shapes["experts.batched_fc1_bias"] = (E, H)
    if fc2_bias:
        shapes["experts.batched_fc2_bias"] = (E, O)
    shapes["_num_global_experts"] = ()
    return shapes


@pytest.mark.parametrize("gate,fc2_bias", [("top", True), ("cosine_top", False)])
def test_state_dict_has_tutel_names_and_round_trips(gate, fc2_bias):
    E, M, H, O = 4, 8, 6, 10
    gate_type = {"type": gate, "k": 2}
    if gate == "cosine_top":
        gate_type["proj_dim"] = 16
    make = lambda: tutel_moe.moe_layer(gate_type=gate_type, model_dim=M,  # noqa: E731
                                       experts={"type": "ffn", "count_per_node": E, "hidden_size_per_expert": H,
                                                "output_dim": O, "has_fc2_bias": fc2_bias,
                                                "activation_fn": torch.relu})
    layer = make()
    state = layer.state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == tutel_state_shapes(E, M, H, O, gate, 16,
                                                                              fc2_bias=fc2_bias)
    assert int(state["_num_global_experts"]) == E
    # A Tutel checkpoint (random values under Tutel's names) loads as is and comes back unchanged.
    g = torch.Generator().manual_seed(0)
    tutel_state = {k: (torch.randn(v.shape, generator=g) if k != "_num_global_experts" else v.clone())
                   for k, v in state.items()}
    other = make()
    other.load_state_dict(tutel_state)
    for k, v in other.state_dict().items():
        assert torch.equal(v, tutel_state[k]), k
    x = torch.randn(5, M, generator=g)
    assert not torch.equal(other(x), layer(x))  # the loaded values are the ones used
    # Tutel's loading rules.
    bad = dict(tutel_state, _num_global_experts=torch.tensor(E + 1))
    with pytest.raises(ValueError, match="global experts"):
        other.load_state_dict(bad)
    partial = {k: v for k, v in tutel_state.items() if k != "experts.batched_fc1_w"}
    with pytest.warns(UserWarning, match="filled with zeros"):
        other.load_state_dict(partial)
    assert float(other.experts.batched_fc1_w.abs().sum()) == 0
    flat = dict(tutel_state, **{"experts.batched_fc2_w": tutel_state["experts.batched_fc2_w"].reshape(-1)})
    other.load_state_dict(flat)
    assert torch.equal(other.experts.batched_fc2_w, tutel_state["experts.batched_fc2_w"])


def test_expert_parameters_are_marked_and_scanned():
    seen = []
    layer = tutel_moe.moe_layer(gate_type={"type": "top", "k": 1}, model_dim=8,
                                experts={"type": "ffn", "count_per_node": 2, "hidden_size_per_expert": 4,
                                         "activation_fn": torch.relu},
                                scan_expert_func=lambda name, p: seen.append(name))
    assert sorted(seen) == sorted(n for n, _ in layer.experts.named_parameters())
    assert all(getattr(p, "_tutel_expert", False) for p in layer.experts.parameters())
    assert not any(getattr(p, "_tutel_expert", False) for p in layer.gates.parameters())


def test_per_call_switches_and_result_func():
    layer = small_layer(dtype=torch.float32, result_func=lambda y: (y, y.l_aux))
    x = torch.randn(2, 6, 8)
    y, l_aux = layer(x)
    assert y.shape == (2, 6, 8) and l_aux.dim() == 0
    # top_k=1 and a dropless capacity factor on one call; the gate's values on the next.
    y1, _ = layer(x, top_k=1, capacity_factor=0.0)
    y2, _ = layer(x)
    assert torch.equal(y2, y) and not torch.equal(y1, y)
    # Two forwards then two backwards (the layer is called twice in a model).
    xa = x.clone().requires_grad_(True)
    xb = (x * 0.5).requires_grad_(True)
    ya, _ = layer(xa)
    yb, _ = layer(xb)
    (ya.sum() + 2 * yb.sum()).backward()
    ref_a = x.clone().requires_grad_(True)
    layer(ref_a)[0].sum().backward()
    assert torch.allclose(xa.grad, ref_a.grad, rtol=1e-6, atol=1e-7)


def test_clear_errors():
    layer = small_layer(dtype=torch.float32)
    with pytest.raises(NotImplementedError, match="CPU tensors only"):
        layer(torch.empty(3, 8, device="meta"))
    with pytest.raises(ValueError, match="model_dim=8"):
        layer(torch.randn(3, 7))
    with pytest.raises(TypeError, match="float16"):
        small_layer(dtype=torch.float16)(torch.randn(3, 8))
    with pytest.raises(ValueError, match="unrecognized argument"):
        tutel_moe.moe_layer(gate_type={"type": "top"}, model_dim=8,
                            experts={"type": "ffn", "hidden_size_per_expert": 4}, no_such_option=1)
    with pytest.raises(ValueError, match="activation_fn"):
        tutel_moe.moe_layer(gate_type={"type": "top"}, model_dim=8,
                            experts={"type": "ffn", "hidden_size_per_expert": 4,
                                     "activation_fn": torch.tanh})


def test_gate_list_chooses_the_gate_per_call():
    layer = tutel_moe.moe_layer(gate_type=[{"type": "top", "k": 1}, {"type": "cosine_top", "k": 2, "proj_dim": 8}],
                                model_dim=8, experts={"type": "ffn", "count_per_node": 4, "hidden_size_per_expert": 4,
                                                      "activation_fn": torch.relu}, seeds=(1, 2, 3))
    keys = set(layer.state_dict())
    assert {"gates.0.wg.weight", "gates.1.cosine_projector.weight", "gates.1.sim_matrix",
            "gates.1.temperature"} <= keys
    x = torch.randn(6, 8)
    layer(x, gate_index=1).sum().backward()
    assert layer.gates[0].wg.weight.grad is None
    assert float(layer.gates[1].cosine_projector.weight.grad.abs().sum()) > 0
    assert not torch.equal(layer(x, gate_index=0), layer(x, gate_index=1))
    with pytest.raises(ValueError, match="gate_index"):
        layer(x, gate_index=2)


class PythonFFN(torch.nn.Module):
    """A user's custom expert (Tutel's constructor keywords): Tutel's ffn computation, written in torch."""

    def __init__(self, model_dim, num_experts_per_device, sharded_count, hidden_size):
        super().__init__()
        L = num_experts_per_device
        self.batched_fc1_w = torch.nn.Parameter(torch.randn(L, hidden_size, model_dim) * 0.3)
        self.batched_fc2_w = torch.nn.Parameter(torch.randn(L, hidden_size, model_dim) * 0.3)
        self.batched_fc1_bias = torch.nn.Parameter(torch.randn(L, hidden_size) * 0.1)
        self.batched_fc2_bias = torch.nn.Parameter(torch.randn(L, model_dim) * 0.1)

    def forward(self, x, ctx):
        h = torch.relu(torch.matmul(x, self.batched_fc1_w.transpose(1, 2)) + self.batched_fc1_bias.unsqueeze(1))
        return torch.matmul(h, self.batched_fc2_w) + self.batched_fc2_bias.unsqueeze(1)


@pytest.mark.parametrize("gate,k,cf,bpr,post", [("top", 2, 1.0, False, True), ("top", 1, 0.0, False, False),
                                                ("top", 2, -0.5, True, True), ("cosine_top", 2, 0.5, False, False)])
def test_custom_experts_stay_python_and_equal_the_builtin_ffn(gate, k, cf, bpr, post):
    E, M, H = 4, 8, 6
    gate_type = {"type": gate, "k": k, "capacity_factor": cf}
    if gate == "cosine_top":
        gate_type["proj_dim"] = 8
    options = dict(gate_type=gate_type, model_dim=M, batch_prioritized_routing=bpr, is_postscore=post,
                   seeds=(1, 2, 3))
    custom = tutel_moe.moe_layer(experts={"type": "custom", "module": PythonFFN, "count_per_node": E,
                                          "hidden_size": H}, **options).double()
    builtin = tutel_moe.moe_layer(experts={"type": "ffn", "count_per_node": E, "hidden_size_per_expert": H,
                                           "activation_fn": torch.relu}, **options).double()
    builtin.load_state_dict(custom.state_dict())
    x = torch.randn(3, 7, M, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ya, yb = custom(xa), builtin(xb)
    assert torch.allclose(ya, yb, rtol=1e-10, atol=1e-12)
    assert torch.allclose(ya.l_aux, yb.l_aux, rtol=1e-10, atol=1e-12)
    (ya.square().sum() + 0.3 * ya.l_aux).backward()
    (yb.square().sum() + 0.3 * yb.l_aux).backward()
    assert torch.allclose(xa.grad, xb.grad, rtol=1e-9, atol=1e-11)
    grads = dict(builtin.named_parameters())
    for name, p in custom.named_parameters():
        assert torch.allclose(p.grad, grads[name].grad, rtol=1e-9, atol=1e-11), name


class PerRowFFN(torch.nn.Module):
    """A custom expert on tokens of A rows of D features (reserve_dims=2): one ffn applied to every row."""

    def __init__(self, model_dim, num_experts_per_device, sharded_count, hidden_size, row_dim):
        super().__init__()
        L, D = num_experts_per_device, row_dim
        self.w1 = torch.nn.Parameter(torch.randn(L, D, hidden_size, dtype=torch.float64) * 0.3)
        self.w2 = torch.nn.Parameter(torch.randn(L, hidden_size, D, dtype=torch.float64) * 0.3)

    def forward(self, x, ctx):  # x [E, C, A, D]
        return torch.einsum("ecah,ehd->ecad", torch.relu(torch.einsum("ecad,edh->ecah", x, self.w1)), self.w2)


class FlatPerRowFFN(PerRowFFN):
    """The same expert on the flattened [E, C, A·D] rows (reserve_dims=1)."""

    def forward(self, x, ctx):
        E, C, M = x.shape
        return super().forward(x.view(E, C, -1, self.w1.shape[1]), ctx).reshape(E, C, M)


def test_reserve_dims_keep_token_dims_for_custom_and_builtin_experts():
    # Tutel's reserve_dims: the last d dims are one token; custom experts see them as [E, C, *dims] and the
    # output keeps the last d dims of theirs; built-in experts run on the flattened rows, output shaped as x.
    A, D, E = 3, 4, 4
    options = dict(gate_type={"type": "top", "k": 2, "capacity_factor": 1.0}, model_dim=A * D, seeds=(1, 2, 3))
    x = torch.randn(5, 6, A, D, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    grouped = tutel_moe.moe_layer(experts={"type": "custom", "module": PerRowFFN, "count_per_node": E,
                                           "hidden_size": 5, "row_dim": D}, **options).double()
    flat = tutel_moe.moe_layer(experts={"type": "custom", "module": FlatPerRowFFN, "count_per_node": E,
                                        "hidden_size": 5, "row_dim": D}, **options).double()
    flat.load_state_dict(grouped.state_dict())
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ya = grouped(xa, reserve_dims=2)
    yb = flat(xb.reshape(5, 6, A * D))
    assert ya.shape == (5, 6, A, D)
    assert torch.allclose(ya, yb.view(5, 6, A, D), rtol=1e-12, atol=1e-14)
    ya.square().sum().backward()
    yb.square().sum().backward()
    assert torch.allclose(xa.grad, xb.grad, rtol=1e-12, atol=1e-14)

    builtin = tutel_moe.moe_layer(experts={"type": "swiglu", "count_per_node": E, "hidden_size_per_expert": 6},
                                  **options).double()
    y2 = builtin(x, reserve_dims=2)
    assert y2.shape == x.shape
    assert torch.equal(y2, builtin(x.reshape(5, 6, A * D)).view(x.shape))
    with pytest.raises(ValueError, match="reserve_dims 4"):
        builtin(x, reserve_dims=4)
    with pytest.raises(ValueError, match="model_dim=12"):
        builtin(x.reshape(5, 3, 2, A * D), reserve_dims=2)


def test_activation_fn_with_self_is_probed_like_activation_fn():
    options = dict(gate_type={"type": "top", "k": 2}, model_dim=8, seeds=(1, 2, 3))
    seen = []

    def gelu_with_self(x, experts):
        seen.append(experts)
        return torch.nn.functional.gelu(x)

    with_self = tutel_moe.moe_layer(experts={"type": "ffn", "count_per_node": 2, "hidden_size_per_expert": 6,
                                             "activation_fn_with_self": gelu_with_self}, **options)
    plain = tutel_moe.moe_layer(experts={"type": "ffn", "count_per_node": 2, "hidden_size_per_expert": 6,
                                         "activation_fn": torch.nn.functional.gelu}, **options)
    assert seen and seen[0] is with_self.experts
    x = torch.randn(10, 8)
    assert torch.equal(with_self(x), plain(x))
    with pytest.raises(ValueError, match="relu, gelu"):
        tutel_moe.moe_layer(experts={"type": "ffn", "count_per_node": 2, "hidden_size_per_expert": 6,
                                     "activation_fn_with_self": lambda x, self: torch.tanh(x)}, **options)
    with pytest.raises(ValueError, match="exactly one"):
        tutel_moe.moe_layer(experts={"type": "ffn", "count_per_node": 2, "hidden_size_per_expert": 6,
                                     "activation_fn": torch.relu,
                                     "activation_fn_with_self": lambda x, self: torch.relu(x)}, **options)
