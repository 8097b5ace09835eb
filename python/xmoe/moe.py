"""xmoe's MoE layer as a drop-in for ``tutel.moe``: ``from xmoe import moe as tutel_moe``.

``moe_layer`` takes Tutel's constructor arguments and has Tutel's parameter names and shapes (a Tutel
``state_dict`` loads as is). Forward and backward run in xmoe's C++ layer (gate, routing, dispatch, experts,
combine, aux loss) through one ``torch.autograd.Function``; tensors cross as DLPack views, without copies.
CPU tensors in float32, bfloat16 and float64. Custom experts (``experts={'type': 'custom', 'module': cls}``)
stay Python: the layer then runs its routing in torch ops around the user's module.

Expert parallelism: under ``mpirun -np W`` the layer's experts are split over the W ranks of ``group``
(``xmoe.net``'s MPI communicator: None is every rank; or a group from ``xmoe.net.world().split(color, key)``;
or a torch.distributed group whose ranks are MPI's, mapped by its ranks) as in Tutel: ``count_per_node`` n > 0
gives n·W global experts, n per rank; n < 0 gives W/|n| experts, each one's hidden dimension split over |n|
ranks. The module's parameters are this rank's experts (or expert shards) under Tutel's names and shapes; the
gate is replicated. Forward and backward (its all-to-alls included) are collective: every rank calls them,
with its own tokens. Gate gradients are this rank's own; average them over the ranks
(``xmoe.net.simple_all_reduce``) as Tutel's examples do. Custom experts and sharded llama_ffn experts stay
single-process.
"""

import math
import os
import warnings

import torch
from torch.utils.dlpack import from_dlpack

from . import _xmoe
from . import net

__all__ = ["moe_layer"]

_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float64: "float64"}


def _activation_name(fn):
    """The activation xmoe runs natively that `fn` computes (checked numerically, so that lambdas such as
    Tutel helloworld's ``lambda x: F.relu(x)`` work)."""
    if fn is None:
        return "relu"
    if isinstance(fn, str):
        return fn
    probe = torch.linspace(-4.0, 4.0, 33, dtype=torch.float64)
    with torch.no_grad():
        got = fn(probe)
    candidates = {
        "relu": torch.relu(probe),
        "gelu": torch.nn.functional.gelu(probe),
        "silu": torch.nn.functional.silu(probe),
        "identity": probe,
    }
    for name, want in candidates.items():
        if isinstance(got, torch.Tensor) and got.shape == want.shape and torch.allclose(
                got.double(), want, rtol=1e-6, atol=1e-7):
            return name
    raise ValueError("experts.activation_fn: xmoe runs relu, gelu (erf), silu or identity natively; this "
                     "function is none of them (use experts={'type': 'custom', ...} for other experts)")


class _Gate(torch.nn.Module):
    """Holds one gate's parameters under Tutel's names (gates.<i>.wg.weight, or the cosine gate's
    cosine_projector.weight, sim_matrix and temperature)."""

    def __init__(self, gate_type, model_dim, num_experts, k, capacity_factor, gate_noise, fp32_gate, proj_dim,
                 init_t):
        super().__init__()
        self.gate_type = gate_type
        self.top_k = min(num_experts, int(k))  # Tutel clamps k to E silently
        self.capacity_factor = float(capacity_factor)
        self.gate_noise = float(gate_noise)
        self.fp32_gate = bool(fp32_gate)
        self.proj_dim = int(proj_dim)
        self.init_t = float(init_t)
        if gate_type == "top":
            self.wg = torch.nn.Linear(model_dim, num_experts, bias=False)
        else:
            self.cosine_projector = torch.nn.Linear(model_dim, self.proj_dim, bias=False)
            self.sim_matrix = torch.nn.Parameter(torch.empty(self.proj_dim, num_experts))
            self.temperature = torch.nn.Parameter(torch.empty(1))

    def xmoe_params(self):
        """This gate's parameters in the C++ layer's order and names."""
        if self.gate_type == "top":
            return {"gate.wg": self.wg.weight}
        return {"gate.cosine_projector": self.cosine_projector.weight, "gate.sim_matrix": self.sim_matrix,
                "gate.temperature": self.temperature}


class _Experts(torch.nn.Module):
    """The built-in experts' parameters: ffn (Tutel's batched_fc*), llama_ffn (Tutel's flat W_fc1..3) or swiglu
    (xmoe's gate_proj/up_proj/down_proj, which the C++ layer reads without a copy)."""

    def __init__(self, expert_type, model_dim, hidden, local_experts, output_dim, has_fc1_bias, has_fc2_bias,
                 sharded_count=1):
        super().__init__()
        self.expert_type = expert_type
        # With experts sharded over sc ranks, this rank holds H/sc of the hidden dimension (and O/sc of the fc2
        # bias), as Tutel's FusedExpertsNetwork.
        sc = sharded_count
        L, M, H, O = local_experts, model_dim, hidden // sc, output_dim
        self.shape = (L, M, H, O)
        if expert_type == "ffn":
            self.batched_fc1_w = torch.nn.Parameter(torch.empty(L, H, M))
            self.batched_fc2_w = torch.nn.Parameter(torch.empty(L, H, O))
            self.batched_fc1_bias = torch.nn.Parameter(torch.empty(L, H)) if has_fc1_bias else None
            self.batched_fc2_bias = torch.nn.Parameter(torch.empty(L, O // sc)) if has_fc2_bias else None
        elif expert_type == "swiglu":
            self.gate_proj = torch.nn.Parameter(torch.empty(L, H, M))
            self.up_proj = torch.nn.Parameter(torch.empty(L, H, M))
            self.down_proj = torch.nn.Parameter(torch.empty(L, M, H))
        else:  # llama_ffn: flat shards of [L, M, H], [L, M, H], [L, H, M] (sharded_count 1)
            self.W_fc1 = torch.nn.Parameter(torch.empty(L * M * H))
            self.W_fc2 = torch.nn.Parameter(torch.empty(L * M * H))
            self.W_fc3 = torch.nn.Parameter(torch.empty(L * H * M))

    def xmoe_params(self):
        """(name, tensor) in the C++ layer's layout, differentiable back to this module's parameters."""
        L, M, H, O = self.shape
        if self.expert_type == "ffn":
            out = {"experts.batched_fc1_w": self.batched_fc1_w, "experts.batched_fc2_w": self.batched_fc2_w}
            if self.batched_fc1_bias is not None:
                out["experts.batched_fc1_bias"] = self.batched_fc1_bias
            if self.batched_fc2_bias is not None:
                out["experts.batched_fc2_bias"] = self.batched_fc2_bias
            return out
        if self.expert_type == "swiglu":
            return {"experts.gate_proj": self.gate_proj, "experts.up_proj": self.up_proj,
                    "experts.down_proj": self.down_proj}
        # Tutel's llama_ffn computes (silu(x W1) * (x W2)) W3 with W1, W2 [L, M, H] and W3 [L, H, M]: xmoe's
        # layout is their transpose (a copy per call; 'swiglu' avoids it).
        return {"experts.gate_proj": self.W_fc1.view(L, M, H).transpose(1, 2),
                "experts.up_proj": self.W_fc2.view(L, M, H).transpose(1, 2),
                "experts.down_proj": self.W_fc3.view(L, H, M).transpose(1, 2)}

    def load_xmoe_values(self, values):
        """Copies the C++ layer's initial values (xmoe names and layout) into this module's parameters."""
        L, M, H, O = self.shape
        with torch.no_grad():
            if self.expert_type == "llama_ffn":
                self.W_fc1.copy_(values["experts.gate_proj"].transpose(1, 2).reshape(-1))
                self.W_fc2.copy_(values["experts.up_proj"].transpose(1, 2).reshape(-1))
                self.W_fc3.copy_(values["experts.down_proj"].transpose(1, 2).reshape(-1))
                return
            for name, p in self.xmoe_params().items():
                p.copy_(values[name])


class _Core:
    """One C++ layer (for one gate and one dtype) and the count of its forwards, so that a backward can tell
    whether the layer still holds its forward's state."""

    def __init__(self, config, group):
        self.layer = _xmoe.Layer(config, group)
        self.names = [name for name, _, _ in self.layer.params()]
        self.forwards = 0


def _detached(t):
    # The C++ layer keeps pointers to what it is given (parameters until the next bind, x until backward): only
    # tensors the autograd context keeps alive may cross, never a temporary contiguous copy.
    assert t.is_contiguous()
    return t.detach()


class _MoeFunction(torch.autograd.Function):
    """y, l_aux = xmoe layer(x; params). Backward: xmoe's exact backward (dx and every parameter gradient)."""

    @staticmethod
    def forward(ctx, core, call, x, *params):
        y, aux = _run_forward(core, call, x, params)
        ctx.core, ctx.call, ctx.forward_id = core, call, core.forwards
        ctx.save_for_backward(x, *params)
        aux_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        return y, torch.tensor(aux, dtype=aux_dtype)

    @staticmethod
    def backward(ctx, dy, daux):
        x, *params = ctx.saved_tensors
        core = ctx.core
        if core.forwards != ctx.forward_id:
            # Another forward ran since (the same layer called twice, gradient checkpointing): redo this one,
            # with its own noise draws, so that the layer holds its state again.
            _run_forward(core, ctx.call, x, params)
        grad_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        grads = [torch.zeros(p.shape, dtype=grad_dtype) for p in params]
        for i, (p, g) in enumerate(zip(params, grads)):
            core.layer.bind(i, _detached(p), g)
        dx = from_dlpack(core.layer.backward(dy.detach().contiguous(), float(daux)))
        grads = [g if g.dtype == p.dtype else g.to(p.dtype) for p, g in zip(params, grads)]
        return (None, None, dx) + tuple(grads)


def _run_forward(core, call, x, params):
    for i, p in enumerate(params):
        core.layer.bind(i, _detached(p), None)
    core.forwards += 1
    y, aux = core.layer.forward(_detached(x), call["top_k"], call["capacity_factor"], call["grouped"],
                                call["training"], call["noise"], call["adaptive_r"], call["a2a_ffn_overlap_degree"])
    return from_dlpack(y), aux


class moe_layer(torch.nn.Module):
    """Tutel's ``tutel.moe.moe_layer`` on xmoe's CPU layer (see the module docstring)."""

    def __init__(self, gate_type, model_dim, experts=None, scan_expert_func=None, result_func=None, group=None,
                 seeds=None, a2a_ffn_overlap_degree=1, is_postscore=True, batch_prioritized_routing=False,
                 normalize_gate=True, is_gshard_loss=True, parallel_type="adaptive:1", use_2dh=False, **kwargs):
        super().__init__()
        for key in kwargs:
            if key == "pad_samples":
                warnings.warn("`pad_samples` option in Tutel Moe-layer has been deprecated, as Tutel always "
                              "assumes `pad_samples=False` for better efficiency.")
            else:
                raise ValueError(f"moe_layer: unrecognized argument '{key}'")
        if experts is None or not isinstance(experts, dict):
            raise ValueError("moe_layer: experts must be a dict with at least 'type'")
        if model_dim % 2 != 0:
            raise ValueError(f"moe_layer: model_dim must be even (as Tutel requires), got {model_dim}")
        self.group = group
        # The xmoe communicator the experts are split over (None: this process alone).
        self._comm = net.resolve_group(group)
        world = 1 if self._comm is None else self._comm.size
        if self._comm is not None and world == 1:
            self._comm = None

        experts = dict(experts)
        expert_type = experts.pop("type")
        n = experts.pop("count_per_node", experts.pop("num_experts_per_device", 1))
        if isinstance(n, float):
            n = -int(1 / (n + 1e-5))  # Tutel's conversion of fractional counts
        n = int(n)
        if n == 0:
            raise ValueError("moe_layer: experts.count_per_node must not be 0")
        if n < 0 and world % -n != 0:
            raise ValueError(f"moe_layer: experts.count_per_node {n}: |n| must divide the world size {world}")
        self.num_global_experts = n * world if n > 0 else max(world // -n, 1)
        self.num_local_experts = n if n > 0 else 1
        self.sharded_count = 1 if n > 0 else max(world // self.num_global_experts, 1)
        self.world_size = world
        self.model_dim = int(model_dim)
        self.is_postscore = bool(is_postscore)
        self.batch_prioritized_routing = bool(batch_prioritized_routing)
        if int(os.environ.get("BATCH_PRIO", 0)) != 0:
            self.batch_prioritized_routing = True
        self.normalize_gate = bool(normalize_gate)
        self.is_gshard_loss = bool(is_gshard_loss)
        self.a2a_ffn_overlap_degree = int(a2a_ffn_overlap_degree)
        self.use_2dh = bool(use_2dh)
        self.result_func = result_func
        self.auto_parallel, self.adaptive_degree = self._parse_parallel_type(parallel_type)
        self.l_aux = None

        if expert_type not in ("ffn", "swiglu", "llama_ffn", "custom"):
            raise ValueError(f"moe_layer: experts.type '{expert_type}' is not one of ffn, swiglu, llama_ffn, "
                             "custom")
        self.expert_type = expert_type
        if world > 1 and expert_type == "custom":
            raise NotImplementedError("moe_layer: custom experts run in Python and have no expert parallelism "
                                      f"across processes yet ({world} ranks); use ffn or swiglu experts")
        if self.sharded_count > 1 and expert_type == "llama_ffn":
            raise NotImplementedError("moe_layer: llama_ffn experts sharded over ranks (count_per_node < -1) are "
                                      "stored as Tutel's flat shards, which xmoe does not split; use swiglu")
        if expert_type == "custom":
            self._build_custom_experts(experts, seeds)
        else:
            self._build_builtin_experts(expert_type, experts)

        gates = gate_type if isinstance(gate_type, (list, tuple)) else [gate_type]
        if seeds is not None and seeds[1] is not None:
            torch.manual_seed(seeds[1])
        # The C++ layer initialises parameters from its own counter-based seeds: draw them from torch's
        # generator (so torch.manual_seed decides the initial values), or take Tutel's `seeds`.
        seed_experts = int(seeds[1]) if seeds is not None and seeds[1] is not None else \
            int(torch.randint(0, 2 ** 62, ()).item())
        if expert_type != "custom":
            self.experts = _Experts(expert_type, self.model_dim, self.hidden_size, self.num_local_experts,
                                    self.output_dim, *self._builtin_expert_options, self.sharded_count)
            if self._activation_with_self is not None:
                fn = self._activation_with_self
                self.activation = _activation_name(lambda x: fn(x, self.experts))
        self.gates = torch.nn.ModuleList()
        self._gate_seeds = []
        for i, g in enumerate(gates):
            if isinstance(g, str):
                if g != "TopNGate":
                    raise ValueError(f"moe_layer: unknown gate type '{g}'")
                g = {"type": "top", "k": 2}
            g = dict(g)
            gtype = g.pop("type", "top")
            if gtype not in ("top", "cosine_top"):
                raise ValueError(f"moe_layer: gate type '{gtype}' is not top or cosine_top")
            if seeds is not None and seeds[0] is not None:
                torch.manual_seed(seeds[0] + i)
                self._gate_seeds.append(int(seeds[0]) + i)
            else:
                self._gate_seeds.append(int(torch.randint(0, 2 ** 62, ()).item()))
            capacity_factor = g.pop("capacity_factor", float(os.environ.get("CAP_FACTOR", 1.0)))
            options = dict(k=g.pop("k", 1), capacity_factor=capacity_factor, gate_noise=g.pop("gate_noise", 0.0),
                           fp32_gate=g.pop("fp32_gate", False))
            if gtype == "cosine_top":
                options.update(proj_dim=g.pop("proj_dim", 256), init_t=g.pop("init_t", 0.5))
            else:
                options.update(proj_dim=256, init_t=0.5)
            if g:
                raise ValueError(f"moe_layer: unrecognized gate options {sorted(g)}")
            self.gates.append(_Gate(gtype, self.model_dim, self.num_global_experts, **options))
        self._expert_seed = seed_experts
        if self._comm is not None:
            self._agree_on_seeds(seeds)
        if not self.is_gshard_loss:
            for gate in self.gates:
                if gate.gate_noise <= 0:
                    raise ValueError("moe_layer: is_gshard_loss=False (importance + load loss) needs "
                                     "gate_noise > 0")
        self.register_buffer("_num_global_experts", torch.tensor(self.num_global_experts))
        self._cores = {}
        self._init_from_xmoe()
        for name, p in self.experts.named_parameters():
            p._tutel_expert = True
            if scan_expert_func is not None:
                scan_expert_func(name, p)
        if seeds is not None and len(seeds) > 2 and seeds[2] is not None:
            torch.manual_seed(seeds[2])

    def _build_builtin_experts(self, expert_type, experts):
        hidden = experts.pop("hidden_size_per_expert", experts.pop("hidden_size", None))
        if hidden is None:
            raise ValueError("moe_layer: experts.hidden_size_per_expert is required")
        output_dim = int(experts.pop("output_dim", self.model_dim) or self.model_dim)
        activation = experts.pop("activation_fn", None)
        # Tutel's activation_fn_with_self(x, experts_module): probed numerically like activation_fn once the
        # experts module exists (_resolve_activation_with_self), so it must compute a native activation too.
        self._activation_with_self = experts.pop("activation_fn_with_self", None)
        if self._activation_with_self is not None and activation is not None:
            raise ValueError("moe_layer: experts.activation_fn_with_self and experts.activation_fn are both given; "
                             "keep exactly one of them (as Tutel requires)")
        if self._activation_with_self is not None and expert_type != "ffn":
            raise ValueError(f"moe_layer: experts.activation_fn_with_self applies to ffn experts, not {expert_type}")
        self.activation = _activation_name(activation) if expert_type == "ffn" else "silu"
        if expert_type in ("swiglu", "llama_ffn") and activation is not None and \
                _activation_name(activation) != "silu":
            raise ValueError(f"moe_layer: {expert_type} experts use silu")
        has_fc1_bias = bool(experts.pop("has_fc1_bias", True))
        has_fc2_bias = bool(experts.pop("has_fc2_bias", True))
        if experts:
            raise ValueError(f"moe_layer: unrecognized experts options {sorted(experts)}")
        if expert_type != "ffn":
            output_dim = self.model_dim
        self.output_dim = output_dim
        self.hidden_size = int(hidden)
        sc = self.sharded_count
        if self.hidden_size % sc != 0:
            raise ValueError(f"moe_layer: experts.hidden_size_per_expert {self.hidden_size} does not split over "
                             f"the {sc} ranks that share each expert")
        if expert_type == "ffn" and has_fc2_bias and output_dim % sc != 0:
            raise ValueError(f"moe_layer: the fc2 bias (output_dim {output_dim}) does not split over the {sc} "
                             "ranks that share each expert (give has_fc2_bias=False or another output_dim)")
        self._builtin_expert_options = (has_fc1_bias, has_fc2_bias)

    def _build_custom_experts(self, experts, seeds):
        """Tutel's custom experts: the user's module, built with model_dim, num_experts_per_device (or the
        legacy local_experts) and sharded_count plus the user's keys, runs in Python on [L, C, M] rows."""
        module = experts.pop("module", None)
        if module is None:
            raise ValueError("moe_layer: experts.type 'custom' needs experts.module")
        if seeds is not None and seeds[1] is not None:
            torch.manual_seed(seeds[1])
        common = dict(model_dim=self.model_dim, sharded_count=self.sharded_count)
        try:
            self.experts = module(num_experts_per_device=self.num_local_experts, **common, **experts)
        except TypeError:
            self.experts = module(local_experts=self.num_local_experts, **common, **experts)
        self.activation, self.hidden_size, self.output_dim = "relu", 1, self.model_dim

    # ------------------------------------------------------------------------------------------------------
    def _parse_parallel_type(self, parallel_type):
        sc = self.sharded_count
        if sc == 1:
            return False, 1
        if parallel_type == "data":
            return False, 1
        if parallel_type == "model":
            return False, sc
        if parallel_type.startswith("adaptive:"):
            return False, min(max(int(parallel_type[len("adaptive:"):]), 0), sc)
        if parallel_type == "auto":
            return True, 1
        raise ValueError(f"moe_layer: unknown parallel_type '{parallel_type}'")

    def _agree_on_seeds(self, seeds):
        """The gate is replicated and the experts are slices of one global model: the seeds the C++ layer
        initialises them from are rank 0's unless Tutel's `seeds` gave them (then each rank keeps its own, as
        Tutel's per-rank s_local)."""
        gate_given = seeds is not None and seeds[0] is not None
        experts_given = seeds is not None and seeds[1] is not None
        if gate_given and experts_given:
            return
        drawn = torch.tensor(self._gate_seeds + [self._expert_seed], dtype=torch.int64)
        self._comm.broadcast(drawn, 0)
        if not gate_given:
            self._gate_seeds = [int(v) for v in drawn[:-1]]
        if not experts_given:
            self._expert_seed = int(drawn[-1])

    def _config(self, gate_index, dtype):
        gate = self.gates[gate_index]
        custom = self.expert_type == "custom"  # the C++ layer then only draws the gate's initial values
        return dict(gate_type=gate.gate_type, k=gate.top_k, capacity_factor=gate.capacity_factor,
                    gate_noise=gate.gate_noise, fp32_gate=gate.fp32_gate, proj_dim=gate.proj_dim,
                    init_t=gate.init_t, model_dim=self.model_dim,
                    expert_type={"llama_ffn": "swiglu", "custom": "ffn"}.get(self.expert_type, self.expert_type),
                    num_experts=self.num_global_experts, hidden_size=self.hidden_size,
                    output_dim=self.output_dim if self.expert_type == "ffn" else 0, activation=self.activation,
                    has_fc1_bias=not custom and getattr(self.experts, "batched_fc1_bias", None) is not None,
                    has_fc2_bias=not custom and getattr(self.experts, "batched_fc2_bias", None) is not None,
                    dtype=_DTYPES[dtype], is_postscore=self.is_postscore,
                    batch_prioritized_routing=self.batch_prioritized_routing, normalize_gate=self.normalize_gate,
                    is_gshard_loss=self.is_gshard_loss, capacity_alignment=1,
                    seed_gate=self._gate_seeds[gate_index], seed_experts=self._expert_seed,
                    adaptive_r=self.adaptive_degree, a2a_ffn_overlap_degree=self.a2a_ffn_overlap_degree,
                    use_2dh=self.use_2dh, local_size=self._local_size())

    @staticmethod
    def _local_size():
        """Ranks per node for use_2dh: LOCAL_SIZE (Tutel's variable), else what Open MPI's launcher says; 0
        lets the C++ layer name the missing variable."""
        for name in ("LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
            if os.environ.get(name):
                return int(os.environ[name])
        return 0

    def _core(self, gate_index, dtype):
        key = (gate_index, dtype)
        if key not in self._cores:
            self._cores[key] = _Core(self._config(gate_index, dtype), self._comm)
        return self._cores[key]

    def _init_from_xmoe(self):
        """Initial values as the C++ layer draws them (its seeds), copied into the torch parameters."""
        for i, gate in enumerate(self.gates):
            core = _xmoe.Layer(self._config(i, torch.float32), self._comm)
            values = {name: from_dlpack(cap).clone() for name, _, cap in core.params()}
            with torch.no_grad():
                for name, p in gate.xmoe_params().items():
                    p.copy_(values[name])
            if i == 0 and self.expert_type != "custom":
                self.experts.load_xmoe_values(values)
            del core

    # ------------------------------------------------------------------------------------------------------
    def get_parameter_iterator(self, param_type):
        if param_type == "gate":
            return self.gates.named_parameters()
        if param_type == "local_experts":
            return self.experts.named_parameters()
        raise ValueError(f"Unrecognized parameter type to MOELayer: {param_type}")

    @staticmethod
    def global_expert_count(num_local_experts, group=None):
        """E for Tutel's count_per_node n: n·W, or W/|n| when n < 0 (W: the group's ranks)."""
        world = net.get_world_size(group)
        if num_local_experts > 0:
            return num_local_experts * world
        return max(world // -num_local_experts, 1)

    @property
    def top_k(self):
        return self.gates[0].top_k

    def extra_repr(self):
        return (f"xmoe: gates {[g.gate_type for g in self.gates]}, experts {self.expert_type} "
                f"E={self.num_global_experts}, model_dim={self.model_dim}, hidden={self.hidden_size}")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # Tutel's rules: the expert count must match; missing expert parameters are zero-filled with a
        # warning; a tensor with the right element count but another shape is reshaped.
        key = prefix + "_num_global_experts"
        if key not in state_dict:
            warnings.warn(f"moe_layer: the checkpoint has no {key}; it may not be a Tutel MoE checkpoint")
        elif int(state_dict[key]) != self.num_global_experts:
            raise ValueError(f"moe_layer: the checkpoint has {int(state_dict[key])} global experts "
                             f"({key}), this layer {self.num_global_experts}")
        for name, p in self.named_parameters():
            k = prefix + name
            if k not in state_dict:
                if name.startswith("experts."):
                    warnings.warn(f"moe_layer: {k} is missing from the checkpoint; filled with zeros")
                    state_dict[k] = torch.zeros_like(p)
            elif state_dict[k].shape != p.shape and state_dict[k].numel() == p.numel():
                state_dict[k] = state_dict[k].reshape(p.shape)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # ------------------------------------------------------------------------------------------------------
    def forward(self, input, gate_index=0, capacity_factor=None, top_k=None, a2a_ffn_overlap_degree=None,
                reserve_dims=1, inequivalent_tokens=False, adaptive_r=None, megablocks_size=0):
        if os.environ.get("SKIP_MOE", "0") != "0":
            input.l_aux = None
            return input if self.result_func is None else self.result_func(input)
        if input.device.type != "cpu":
            raise NotImplementedError(f"moe_layer: xmoe runs on CPU tensors only (no CUDA backend yet); input is "
                                      f"on {input.device}")
        # Tutel's reserve_dims d: the last d dims of the input are one token's features (their product is
        # model_dim). Custom experts get them back as [E, C, *those dims] and the output keeps the last d dims
        # of what they return; built-in experts work on the flattened model_dim rows, and the output keeps the
        # input's shape (which needs output_dim == model_dim).
        reserve_dims = int(reserve_dims)
        if reserve_dims == 1:
            if input.shape[-1] != self.model_dim:
                raise ValueError(f"moe_layer: input's last dimension must be model_dim={self.model_dim}, got shape "
                                 f"{tuple(input.shape)}")
        else:
            if not 1 <= reserve_dims < input.dim():
                raise ValueError(f"moe_layer: reserve_dims {reserve_dims} must be in [1, {input.dim() - 1}] for an "
                                 f"input of shape {tuple(input.shape)} (at least one token dim stays)")
            if math.prod(input.shape[-reserve_dims:]) != self.model_dim:
                raise ValueError(f"moe_layer: the last {reserve_dims} dims of the input {tuple(input.shape)} must "
                                 f"hold model_dim={self.model_dim} features")
            if self.expert_type != "custom" and self.output_dim != self.model_dim:
                raise ValueError(f"moe_layer: reserve_dims {reserve_dims} with built-in experts needs output_dim "
                                 f"== model_dim (the output takes the input's shape), got {self.output_dim}")
        if not 0 <= gate_index < len(self.gates):
            raise ValueError(f"moe_layer: gate_index {gate_index} out of range [0, {len(self.gates)})")
        if a2a_ffn_overlap_degree is not None:
            self.a2a_ffn_overlap_degree = int(a2a_ffn_overlap_degree)  # sticky, as Tutel's
        if adaptive_r is not None:
            self.adaptive_degree = int(adaptive_r)  # sticky, as Tutel's
        gate = self.gates[gate_index]
        if self.expert_type == "custom":
            return self._forward_custom(input, gate, top_k, capacity_factor, reserve_dims)
        expert_params = self.experts.xmoe_params()
        dtype = next(iter(expert_params.values())).dtype
        if dtype not in _DTYPES:
            raise TypeError(f"moe_layer: xmoe's layer runs float32, bfloat16 and float64, the experts hold {dtype}")
        k = min(int(top_k or gate.top_k), self.num_global_experts)
        cf = gate.capacity_factor if capacity_factor is None else float(capacity_factor)
        noise = None
        if self.training and gate.gate_noise > 0:
            acc = torch.float64 if dtype == torch.float64 else torch.float32
            n_tokens = input.numel() // self.model_dim
            noise = torch.randn(n_tokens, self.num_global_experts, dtype=acc)
        grouped = bool(megablocks_size and megablocks_size > 0 and self.num_local_experts > 1 and
                       not torch.is_grad_enabled() and self.world_size == 1)
        call = dict(top_k=k, capacity_factor=cf, grouped=grouped, training=self.training, noise=noise,
                    adaptive_r=self.adaptive_degree, a2a_ffn_overlap_degree=self.a2a_ffn_overlap_degree)
        named = list(gate.xmoe_params().items()) + list(expert_params.items())
        core = self._core(gate_index, dtype)
        if core.names != [name for name, _ in named]:
            raise RuntimeError(f"moe_layer: parameter order {core.names} of the C++ layer differs from "
                               f"{[name for name, _ in named]}")
        params = [p.to(dtype).contiguous() for _, p in named]
        x = input.reshape(-1, self.model_dim).to(dtype).contiguous()
        y, l_aux = _MoeFunction.apply(core, call, x, *params)
        y = y.view(list(input.shape[:-1]) + [y.shape[-1]] if reserve_dims == 1 else input.shape).to(input.dtype)
        self.l_aux = y.l_aux = l_aux
        if self.result_func is not None:
            return self.result_func(y)
        return y


    def _forward_custom(self, input, gate, top_k, capacity_factor, reserve_dims):
        """Custom experts stay Python: the layer's semantics (the C++ layer's gate, routing, capacity, dispatch,
        combine and losses) in torch ops, autograd for the backward, the user's module on [L, C, M]."""
        E, M = self.num_global_experts, self.model_dim
        params = list(self.experts.parameters())
        dtype = params[0].dtype if params else input.dtype
        x = input.reshape(-1, M).to(dtype)
        T = x.shape[0]
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        xa = x.to(acc)
        if gate.gate_type == "top":
            logits = xa @ gate.wg.weight.to(acc).t()
        else:
            proj = torch.nn.functional.normalize(xa @ gate.cosine_projector.weight.to(acc).t(), dim=1)
            sim = torch.nn.functional.normalize(gate.sim_matrix.to(acc), dim=0)
            logits = (proj @ sim) * gate.temperature.to(acc).clamp(max=math.log(100.0)).exp()
        noisy = logits
        if self.training and gate.gate_noise > 0:
            noisy = logits + gate.gate_noise * torch.randn(T, E, dtype=acc) / E
        scores = torch.softmax(noisy, dim=1)
        k = min(int(top_k or gate.top_k), E)
        ids = torch.topk(scores.detach(), k, dim=1).indices.t()  # [k, T]
        g = [scores.gather(1, ids[j].view(-1, 1)).view(-1) for j in range(k)]
        if self.normalize_gate and k > 1:
            denom = torch.stack(g).sum(0).clamp(min=torch.finfo(acc).eps)
            g = [v / denom for v in g]
        # Slots: within an expert, every first choice in token order (or by descending max score with
        # batch-prioritized routing), then every second choice, ...
        order = torch.sort(-scores.detach().max(dim=1).values, stable=True).indices \
            if self.batch_prioritized_routing else torch.arange(T)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(T)
        base = torch.zeros(E, dtype=torch.int64)
        locations = []
        for j in range(k):
            mask = torch.nn.functional.one_hot(ids[j], E)
            cum = torch.cumsum(mask[order], dim=0)[inverse] - 1 + base
            locations.append(cum.gather(1, ids[j].view(-1, 1)).view(-1))
            base = base + mask.sum(0)
        cf = gate.capacity_factor if capacity_factor is None else float(capacity_factor)
        spe = -(-T // E)
        dropless = int(base.max()) if T else 0
        C = k * int(cf * spe) if cf > 0 else dropless if cf == 0 else min(dropless, k * int(-cf * spe))
        C = max(C, 1)
        O = None
        dispatched = torch.zeros(E * C, M, dtype=dtype)
        kept = [locations[j] < C for j in range(k)]
        for j in range(k):
            rows = (ids[j] * C + locations[j])[kept[j]]
            src = x[kept[j]] if self.is_postscore else (x[kept[j]].to(acc) * g[j][kept[j]].view(-1, 1)).to(dtype)
            dispatched = dispatched.index_add(0, rows, src)
        expert_out = self.experts(dispatched.view([E, C] + list(input.shape[-reserve_dims:])), self)
        out_shape = list(expert_out.shape[-reserve_dims:])
        O = math.prod(expert_out.shape[2:])
        expert_out = expert_out.reshape(E * C, O).to(acc)
        y = torch.zeros(T, O, dtype=acc)
        for j in range(k):
            rows = (ids[j] * C + locations[j])[kept[j]]
            part = expert_out[rows] * (g[j][kept[j]].view(-1, 1) if self.is_postscore else 1.0)
            y = y.index_add(0, torch.arange(T)[kept[j]], part)
        if self.is_gshard_loss:
            first = torch.nn.functional.one_hot(ids[0], E).sum(0).to(acc)
            l_aux = E / (T * T) * (scores.sum(0) * first).sum() if T else scores.sum() * 0
        else:
            clean = torch.softmax(logits, dim=1)
            imp = clean.sum(0)
            thr = noisy.gather(1, ids[k - 1].view(-1, 1))
            load = (0.5 * (1 + torch.erf((clean - thr) / (gate.gate_noise / E * math.sqrt(2.0))))).sum(0)
            l_aux = (imp.var() / (imp.mean() ** 2 + 1e-10) + load.var() / (load.mean() ** 2 + 1e-10)) / 2
        y = y.view(list(input.shape[:-reserve_dims]) + out_shape).to(input.dtype)
        self.l_aux = y.l_aux = l_aux.to(torch.float64 if dtype == torch.float64 else torch.float32)
        return y if self.result_func is None else self.result_func(y)


# Tutel's other name for the layer.
MOELayer = moe_layer
