"""Expert parallelism from Python under mpirun against the single-process layer.

Run: mpirun -np 2 python python/tests/mpi_expert_parallel.py (tools/run-tests.sh does, with Open MPI's flags).

The oracle is the single-process xmoe.moe.moe_layer (itself checked against PyTorch autograd in
test_layer_oracle.py), built on every rank in a group of that rank alone, with the same global parameters:
random values (biases too) drawn identically on every rank, and each expert-parallel rank loading its own slice
(its experts, or its slice of a sharded expert's hidden dimension) through load_state_dict under Tutel's names
and shapes. Rank r's tokens go through the expert-parallel layer; the reference runs every rank's tokens one
rank after the other, which is what expert parallelism computes:
  - y, y.l_aux, dx and the gate's gradient: the reference on rank r's tokens alone (the gate is replicated and
    its gradient is the rank's own, as in Tutel);
  - expert gradients: the reference's gradient accumulated over every rank's tokens, sliced to rank r's part.
Cases: ffn and swiglu experts, top-1 and top-2, capacity factor 1 and 0, count_per_node 2 (E = 2·W) and -W (one
expert sharded over every rank) with every adaptive_r the layer accepts (0, 1 and, sharded, 2 at np 2),
a2a_ffn_overlap_degree 2, use_2dh, float64, and SGD steps (gate gradients summed over the ranks with
xmoe.net.simple_all_reduce) whose per-rank losses and final parameters must equal the reference trained on the
sum of every rank's loss, with adaptive_r switched on every call. Also: without `seeds` the gate is the same on
every rank and the experts are slices of one global model; a torch.distributed group maps onto xmoe's MPI
groups.
Metric as test_layer_oracle.py: max|a - b| / max(max|b|, 1e-6) <= 1e-5 (float32), 1e-10 (float64); r = 1
gives the reference's rows exactly, r != 1 and the reduced gradients add partial sums in another order.
"""

import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

from xmoe import moe as tutel_moe
from xmoe import net

M, H, T = 16, 24, 24  # model_dim, hidden size, tokens per rank: capacities stay multiples of every alignment
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def rel_err(a, b):
    a, b = a.detach().double(), b.detach().double()
    if a.shape != b.shape:
        return float("inf")
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-6) if b.numel() else 0.0


def tokens(src, dtype):
    g = torch.Generator().manual_seed(100 + src)
    return torch.randn(T, M, generator=g, dtype=torch.float64).to(dtype)


def upstream(src, dtype):
    g = torch.Generator().manual_seed(200 + src)
    return torch.randn(T, M, generator=g, dtype=torch.float64).to(dtype)


class Check:
    def __init__(self, world):
        self.world = world
        self.failures = 0
        self.cases = 0

    def expect(self, what, got, want, tol):
        err = rel_err(got, want)
        if not err <= tol:
            self.failures += 1
            print(f"[rank {self.world.rank}] FAIL {what}: rel err {err:.3g} > {tol:g}", flush=True)
        return err


def build(case, count_per_node, group):
    experts = {"type": case["expert"], "count_per_node": count_per_node, "hidden_size_per_expert": H}
    if case["expert"] == "ffn":
        experts["activation_fn"] = lambda x: F.gelu(x)
    layer = tutel_moe.moe_layer(gate_type={"type": "top", "k": case["k"], "capacity_factor": case["cf"]},
                                model_dim=M, experts=experts, seeds=(1, 2, 3), group=group,
                                a2a_ffn_overlap_degree=case.get("overlap", 1), use_2dh=case.get("use_2dh", False))
    return layer.to(case.get("dtype", torch.float32))


def local_part(name, whole, n, rank):
    """Rank `rank`'s part of a global parameter under count_per_node n: its n experts, or (n < 0) its
    contiguous slice of expert rank // |n| along the dimension the hidden size (or fc2 bias) splits."""
    if not name.startswith("experts."):
        return whole
    if n > 0:
        return whole[rank * n:(rank + 1) * n]
    sc = -n
    one = whole[rank // sc:rank // sc + 1]
    return one.chunk(sc, dim=2 if name.endswith("down_proj") else 1)[rank % sc]


def make_pair(case, world, solo):
    """(expert-parallel layer, reference layer on the global parameters), the reference randomised."""
    W, rank, n = world.size, world.rank, case["n"]
    E = n * W if n > 0 else W // -n
    ref = build(case, E, solo)
    ep = build(case, n, None)
    # Same seeds: the expert-parallel layer starts as the slice of the reference's initial values.
    initial = {k: local_part(k, v, n, rank) for k, v in ref.state_dict().items()}
    for k, v in ep.state_dict().items():
        if rel_err(v, initial[k]) != 0.0:
            raise AssertionError(f"{describe(case)}: initial {k} is not rank {rank}'s slice of the global one")
    # Random global values (biases included, so that a bias counted more or less than once shows).
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))
    ep.load_state_dict({k: local_part(k, v, n, rank) for k, v in ref.state_dict().items()})
    return ep, ref


def describe(case):
    keys = ("expert", "n", "k", "cf", "r", "overlap", "use_2dh")
    out = " ".join(f"{k}={case[k]}" for k in keys if k in case)
    return out + (" float64" if case.get("dtype") == torch.float64 else "")


def forward_backward(layer, src, case, dtype):
    layer.zero_grad()
    x = tokens(src, dtype).requires_grad_()
    y = layer(x, adaptive_r=case.get("r"))
    ((y * upstream(src, dtype)).sum() + 0.5 * y.l_aux).backward()
    return y.detach(), float(y.l_aux), x.grad


def compare(check, case, world, solo):
    dtype = case.get("dtype", torch.float32)
    tol = TOL[dtype]
    ep, ref = make_pair(case, world, solo)
    y, aux, dx = forward_backward(ep, world.rank, case, dtype)
    got = {k: p.grad.clone() for k, p in ep.named_parameters()}
    ref_case = dict(case, r=None)
    want_y, want_aux, want_dx = forward_backward(ref, world.rank, ref_case, dtype)
    want_gate = {k: p.grad.clone() for k, p in ref.named_parameters() if k.startswith("gates.")}
    ref.zero_grad()
    for src in range(world.size):  # every rank's tokens, gradients accumulated
        x = tokens(src, dtype)
        out = ref(x)
        ((out * upstream(src, dtype)).sum() + 0.5 * out.l_aux).backward()
    what = describe(case)
    errs = [check.expect(f"{what}: y", y, want_y, tol), check.expect(f"{what}: dx", dx, want_dx, tol),
            check.expect(f"{what}: l_aux", torch.tensor(aux), torch.tensor(want_aux), tol)]
    for k, g in got.items():
        want = want_gate[k] if k.startswith("gates.") else local_part(k, dict(ref.named_parameters())[k].grad,
                                                                       case["n"], world.rank)
        errs.append(check.expect(f"{what}: grad {k}", g, want, tol))
    check.cases += 1
    return max(errs)


def training(check, case, world, solo, rs, steps=3, lr=0.1):
    """SGD steps: the expert-parallel layer (r switched per call) against the reference trained on the sum of
    every rank's loss; per-step losses and the final parameters."""
    tol = 1e-4  # float32 over several steps
    ep, ref = make_pair(case, world, solo)
    opt_ep = torch.optim.SGD(ep.parameters(), lr=lr)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=lr)
    what = describe(case) + " SGD"

    def loss_of(layer, src, r=None):
        y = layer(tokens(src, torch.float32), adaptive_r=r)
        return F.log_softmax(y.sum(dim=1), dim=0)[0].neg() + 0.1 * y.l_aux

    for step in range(steps):
        opt_ep.zero_grad()
        loss = loss_of(ep, world.rank, rs[step % len(rs)])
        loss.backward()
        for p in ep.parameters():
            if not getattr(p, "_tutel_expert", False):
                p.grad = net.simple_all_reduce(p.grad)
        opt_ep.step()
        opt_ref.zero_grad()
        want = None
        for src in range(world.size):
            ref_loss = loss_of(ref, src)
            ref_loss.backward()
            if src == world.rank:
                want = ref_loss.detach()
        opt_ref.step()
        check.expect(f"{what}: loss at step {step}", loss.detach(), want, tol)
    ref_params = dict(ref.named_parameters())
    for k, p in ep.named_parameters():
        check.expect(f"{what}: {k} after {steps} steps", p, local_part(k, ref_params[k], case["n"], world.rank), tol)
    check.cases += 1


def replicated_without_seeds(check, world):
    """Without Tutel's `seeds`, ranks whose torch generators differ still get one gate (replicated) and their
    slices of one global expert model (rank 0's seeds)."""
    torch.manual_seed(1000 + world.rank)
    layer = tutel_moe.moe_layer(gate_type={"type": "top", "k": 2}, model_dim=M,
                                experts={"type": "ffn", "count_per_node": 1, "hidden_size_per_expert": H})
    torch.manual_seed(1000)  # rank 0's generator: the single-process layer draws the same seeds
    solo = world.split(world.rank, 0)
    whole = tutel_moe.moe_layer(gate_type={"type": "top", "k": 2}, model_dim=M, group=solo,
                                experts={"type": "ffn", "count_per_node": world.size, "hidden_size_per_expert": H})
    whole_state = whole.state_dict()
    for k, v in layer.state_dict().items():
        check.expect(f"no seeds: {k}", v, local_part(k, whole_state[k], 1, world.rank), 0.0)
    check.cases += 1


def torch_distributed_groups(check, world, solo):
    """A torch.distributed group given as `group` (torch's ranks are MPI's, gloo over TCP): the world maps to
    xmoe's world, a group of one rank to the single-process layer."""
    import torch.distributed as dist
    port = torch.tensor([0], dtype=torch.int64)
    if world.rank == 0:
        import socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port[0] = sock.getsockname()[1]
    world.broadcast(port, 0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{int(port)}", rank=world.rank,
                            world_size=world.size)
    singletons = [dist.new_group([r]) for r in range(world.size)]
    case = dict(expert="swiglu", n=2, k=2, cf=1.0)
    E = 2 * world.size
    for group, count, want_layer in ((dist.group.WORLD, 2, build(case, 2, None)),
                                     (singletons[world.rank], E, build(case, E, solo))):
        got = tutel_moe.moe_layer(gate_type={"type": "top", "k": 2, "capacity_factor": 1.0}, model_dim=M,
                                  experts={"type": "swiglu", "count_per_node": count, "hidden_size_per_expert": H},
                                  seeds=(1, 2, 3), group=group)
        x = tokens(world.rank, torch.float32)
        check.expect(f"torch.distributed group of {dist.get_world_size(group)}: y", got(x), want_layer(x), 0.0)
    dist.destroy_process_group()
    check.cases += 1


def helloworld_parallel_types(check, world):
    """Tutel's test_compare_data_model_parallel on xmoe.examples.helloworld under mpirun: one expert sharded over
    every rank, parallel_type data (r = 1) and model (r = W) give the same losses; rank 0 prints the lines."""
    import contextlib
    import io
    import re
    from xmoe.examples import helloworld
    losses = {}
    for parallel_type in ("data", "model"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            helloworld.main(["--batch_size", "1", "--num_tokens", "32", "--model_dim", "16", "--hidden_size", "16",
                             "--num_local_experts", str(-world.size), "--num_steps", "3", "--dtype", "float64",
                             "--parallel_type", parallel_type])
        torch.set_default_dtype(torch.float32)
        lines = re.findall(r"STEP-\d+: loss = ([-0-9.]+), step_time", out.getvalue())
        if world.rank == 0 and len(lines) != 3:
            check.failures += 1
            print(f"FAIL helloworld --parallel_type {parallel_type}: expected 3 STEP lines on rank 0, got:\n"
                  f"{out.getvalue()}", flush=True)
        if world.rank != 0 and out.getvalue():
            check.failures += 1
            print(f"[rank {world.rank}] FAIL helloworld printed on a rank other than 0", flush=True)
        losses[parallel_type] = torch.tensor([float(v) for v in lines], dtype=torch.float64)
    check.expect("helloworld losses, parallel_type model vs data", losses["model"], losses["data"], 1e-5)
    check.cases += 1


def main():
    world = net.world()
    W, rank = world.size, world.rank
    if W < 2:
        print("mpi_expert_parallel: run under mpirun -np 2 (or more)", file=sys.stderr)
        return 2
    solo = world.split(rank, 0)  # this rank alone: the single-process layer
    check = Check(world)
    start = time.perf_counter()
    for expert in ("ffn", "swiglu"):
        for n in (2, -W):
            sc = 1 if n > 0 else -n
            for k in (1, 2):
                for cf in (1.0, 0.0):
                    for r in [0] + [d for d in range(1, sc + 1) if sc % d == 0]:
                        case = dict(expert=expert, n=n, k=k, cf=cf, r=r)
                        err = compare(check, case, world, solo)
                        if rank == 0:
                            print(f"  {describe(case)}: max rel err {err:.2g}", flush=True)
    for n in (2, -W):
        for extra in (dict(overlap=2), dict(use_2dh=True), dict(dtype=torch.float64)):
            case = dict(expert="swiglu", n=n, k=2, cf=1.0, r=1, **extra)
            err = compare(check, case, world, solo)
            if rank == 0:
                print(f"  {describe(case)}: max rel err {err:.2g}", flush=True)
    for expert in ("ffn", "swiglu"):
        for n in (2, -W):
            sc = 1 if n > 0 else -n
            rs = [1, 0] + [d for d in range(2, sc + 1) if sc % d == 0]
            training(check, dict(expert=expert, n=n, k=2, cf=1.0), world, solo, rs)
    replicated_without_seeds(check, world)
    torch_distributed_groups(check, world, solo)
    helloworld_parallel_types(check, world)
    failures = torch.tensor([check.failures], dtype=torch.int64)
    world.all_reduce(failures, "sum")
    if rank == 0:
        print(f"mpi_expert_parallel: {check.cases} cases on {W} ranks, {int(failures)} failed checks "
              f"({time.perf_counter() - start:.1f} s)", flush=True)
    return 1 if int(failures) else 0


if __name__ == "__main__":
    try:
        code = main()
    except BaseException:  # a rank that stops early would leave the others waiting in a collective
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.exit(code)
