"""xmoe's communicator from Python (the part of ``tutel.net`` that expert parallelism needs).

Under ``mpirun -np N python script.py`` the first use creates the process's one MPI session
(``MPI_Init_thread``, finalized at interpreter exit) and its world communicator; mpi4py and torch.distributed
are not needed (if mpi4py initialised MPI first, xmoe adopts it). Without a launcher (or with one rank) there
is no session and every layer runs in this process alone.

Groups are ``xmoe._xmoe.Comm`` objects: ``world()`` and what ``split`` makes of it. Every collective (layer
forward and backward included) must be called by every rank of the group, from the thread that first used
this module, and waits at most ``XMOE_COMM_TIMEOUT_S`` seconds (default 300) before ending the job with a
message naming the collective.
"""

import atexit
import os

import torch

from . import _xmoe

__all__ = ["world", "launched_world_size", "get_world_size", "get_world_rank", "resolve_group",
           "simple_all_reduce", "barrier"]

# The world size a launcher announces to its processes: Open MPI, MPICH/Intel MPI (PMI), PMIx.
_LAUNCHER_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE")


class _Process:
    """The process-wide MPI session and world communicator (MPI can be initialised once per process)."""
    session = None
    world = None
    torch_groups = {}  # torch.distributed group -> the xmoe group split for it (a split is collective)


def launched_world_size():
    """How many processes the launcher started (1 without mpirun)."""
    for name in _LAUNCHER_SIZE_VARIABLES:
        value = os.environ.get(name)
        if value:
            try:
                return max(int(value), 1)
            except ValueError:
                raise ValueError(f"xmoe.net: environment variable {name}={value!r} is not an integer") from None
    return 1


def _finalize():
    if _Process.session is not None:
        _Process.world = None
        _Process.torch_groups.clear()
        _Process.session.close()  # MPI_Finalize; layers still alive stay safe to destroy
        _Process.session = None


def world():
    """The communicator over every process of the job (creates the MPI session on first use)."""
    if _Process.world is None:
        if not _xmoe.mpi_available:
            raise RuntimeError("xmoe.net: this xmoe was built without MPI (install Open MPI, e.g. Debian's "
                               "openmpi-bin libopenmpi-dev, and reinstall the package)")
        _Process.session = _xmoe.MpiSession()
        atexit.register(_finalize)
        _Process.world = _Process.session.world()
    return _Process.world


def _torch_group_ranks(group):
    """The world ranks of a torch.distributed group, or None when this torch cannot tell them."""
    dist = torch.distributed
    if hasattr(dist, "get_process_group_ranks"):
        return list(dist.get_process_group_ranks(group))
    table = getattr(dist.distributed_c10d, "_pg_group_ranks", None)  # torch < 2.0
    if table is not None and group in table:
        return sorted(table[group].keys())
    return None


def _refuse_torch_only_world():
    """A job that torch.distributed sees as several processes but no MPI launcher started (torchrun): Tutel
    would split the experts over torch's world, which xmoe cannot reach; say so instead of running alone."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise RuntimeError(f"moe_layer: torch.distributed has {dist.get_world_size()} processes, but xmoe's expert "
                           "parallelism runs over MPI: launch the job with mpirun (torch.distributed may still be "
                           "used alongside)")


def resolve_group(group):
    """The xmoe communicator a layer's ``group`` argument means, or None for the single-process layer.

    None: the world when the job has more than one process. An ``xmoe._xmoe.Comm``: itself. A
    torch.distributed group: mapped onto xmoe's MPI world by its world ranks, when torch's ranks are MPI's
    (as with Tutel's ``create_groups_from_world`` under mpirun); collective over the world, so every rank must
    build its layer with its own group in the same order."""
    if group is None:
        if launched_world_size() > 1:
            return world()
        _refuse_torch_only_world()
        return None
    if isinstance(group, _xmoe.Comm):
        return group
    dist = torch.distributed
    if not (dist.is_available() and isinstance(group, dist.ProcessGroup)):
        raise TypeError(f"moe_layer: group must be None, an xmoe.net group or a torch.distributed group, got "
                        f"{type(group).__name__}")
    w = world() if launched_world_size() > 1 else None
    torch_world_size, torch_rank = dist.get_world_size(), dist.get_rank()
    if w is None or w.size != torch_world_size or w.rank != torch_rank:
        raise ValueError(
            "moe_layer: group is a torch.distributed group, but xmoe's expert parallelism runs over MPI and torch's "
            f"ranks are not MPI's (torch rank {torch_rank} of {torch_world_size}, MPI "
            f"{'not launched' if w is None else f'rank {w.rank} of {w.size}'}): launch with mpirun and give "
            "group=None or an xmoe.net group")
    ranks = _torch_group_ranks(group)
    if ranks is None:
        raise ValueError("moe_layer: cannot tell the ranks of this torch.distributed group (give group=None or an "
                         "xmoe.net group)")
    if len(ranks) == w.size:
        return w
    if group not in _Process.torch_groups:
        _Process.torch_groups[group] = w.split(min(ranks), ranks.index(w.rank))
    return _Process.torch_groups[group]


def get_world_size(group=None):
    g = resolve_group(group)
    return 1 if g is None else g.size


def get_world_rank(group=None):
    g = resolve_group(group)
    return 0 if g is None else g.rank


def simple_all_reduce(input, group=None, op="sum"):
    """A reduced copy of a CPU tensor over the group (Tutel's ``net.simple_all_reduce``; op sum|max|min)."""
    output = input.detach().clone().contiguous()
    g = resolve_group(group)
    if g is None or g.size == 1:
        return output
    if output.dtype.is_floating_point and output.dtype not in (torch.float32, torch.float64):
        reduced = output.float()
        g.all_reduce(reduced, op)
        return reduced.to(output.dtype)
    g.all_reduce(output, op)
    return output


def barrier(group=None):
    g = resolve_group(group)
    if g is not None:
        g.barrier()

