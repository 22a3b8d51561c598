"""Data-parallel training over ``torch.distributed`` ranks with the objective of one process.

With ``fit(..., distributed=True)`` under ``torchrun`` (or any initialised process group), every rank reads its own
part of each global batch, computes pyro_bbb's ELBO on it (likelihood scaled by ``N / b_r``, the KL once), and the
gradients are combined as ``sum_r (b_r / G) * grad_r`` where ``G = sum_r b_r`` is the global batch. That is
exactly the gradient of ``N / G * NLL(global batch) + KL``: one process's objective on the concatenated batch,
whatever the shard sizes (a ragged last batch, an empty shard). Parameters are set up once and broadcast from rank
0, so every rank holds the same guide; a failure on any rank (bad data, a NaN) is raised on every rank with the
failing rank's message, so no rank hangs in a collective.

Examples
--------
Launch ``torchrun --nproc_per_node=4 train.py`` with::

    torch.distributed.init_process_group("gloo")       # "nccl" on GPUs
    history = pyro_bbb.fit(bnn, guide, (x, y), epochs=20, batch_size=64, distributed=True, seed=0)
"""

from __future__ import annotations

from collections.abc import Iterator

import pyro
import torch
import torch.distributed as dist

from .._inputs import inputs_to, num_rows, select_rows
from .._internals import module_local_params_enabled

__all__ = [
    "ShardedBatches", "synchronise_parameters", "synchronise_buffers", "combine_gradients",
    "raise_if_any_rank_failed", "collective_device", "all_reduce_sum", "require_process_group",
]


def require_process_group() -> tuple[int, int]:
    """``(rank, world size)`` of the initialised process group, or a clear error; also an error under Pyro's
    ``module_local_params``, whose parameters live in the modules, where the broadcast and the gradient sum (both
    over Pyro's param store) would not find them.

    Examples
    --------
    >>> require_process_group()
    Traceback (most recent call last):
    ...
    ValueError: fit(distributed=True) needs an initialised torch.distributed process group: ...
    """
    if module_local_params_enabled():
        raise ValueError(
            "fit(distributed=True) broadcasts the guide's parameters and sums their gradients over Pyro's param "
            "store, but pyro.settings has module_local_params=True, which keeps them in the modules: call "
            "pyro.settings.set(module_local_params=False) before building the model and guide, or train without "
            "distributed=True."
        )
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "fit(distributed=True) needs an initialised torch.distributed process group: launch with torchrun and "
            'call torch.distributed.init_process_group("nccl" or "gloo") first.'
        )
    return dist.get_rank(), dist.get_world_size()


class ShardedBatches:
    """Each rank's part of every global batch: the same permutation on every rank (seeded by ``seed`` and the
    epoch), global batches of ``batch_size * world`` cut into ``world`` contiguous parts. Every rank takes the same
    number of steps; a rank whose part of the last global batch is empty gets an empty batch.

    Examples
    --------
    ::

        for x, y in ShardedBatches(x_all, y_all, batch_size=32, rank=dist.get_rank(),
                                   world=dist.get_world_size(), seed=0, device=None):
            ...
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, rank: int, world: int, seed: int,
                 device):
        self.x, self.y, self.batch_size, self.rank, self.world = x, y, batch_size, rank, world
        self.seed, self.device, self.epoch = seed, device, 0
        self.num_data = num_rows(x)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        self.epoch += 1
        order = torch.randperm(self.num_data, generator=generator)
        for global_batch in order.split(self.batch_size * self.world):
            idx = global_batch[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
            yield inputs_to(select_rows(self.x, idx), self.device), self.y[idx].to(self.device)


def _named_parameters() -> list[tuple[str, torch.Tensor]]:
    return sorted(pyro.get_param_store().named_parameters())


def collective_device() -> torch.device:
    """Where the tensors of a collective live: the parameters' device, and a CUDA device under NCCL (which reduces
    CUDA tensors only).

    Examples
    --------
    ::

        flag = torch.zeros(1, device=collective_device())
        dist.all_reduce(flag)
    """
    params = _named_parameters()
    device = params[0][1].device if params else torch.device("cpu")
    if device.type == "cpu" and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return device


@torch.no_grad()
def synchronise_buffers(module: torch.nn.Module, src: int = 0) -> None:
    """Broadcast every buffer of ``module`` (e.g. BatchNorm's running statistics) from rank ``src``, as DDP does.

    Examples
    --------
    ::

        synchronise_buffers(model)   # every rank now holds rank 0's running means and variances
    """
    device = collective_device()
    for buffer in module.buffers():
        staged = buffer.to(device)
        dist.broadcast(staged, src=src)
        if staged is not buffer:
            buffer.copy_(staged)


@torch.no_grad()
def synchronise_parameters(src: int = 0) -> None:
    """Broadcast every parameter in Pyro's param store from rank ``src`` (same order on every rank: by name).

    Examples
    --------
    ::

        set_up_autoguide(guide, x_first, y_first)   # create the parameters on every rank
        synchronise_parameters()                   # then give every rank rank 0's values
    """
    for _, param in _named_parameters():
        dist.broadcast(param.data, src=src)


def raise_if_any_rank_failed(error: BaseException | None) -> None:
    """Collective: if any rank failed, raise on every rank (the failing rank's own exception there; elsewhere a
    ValueError carrying its message). Ranks that did not fail pass ``None``.

    Examples
    --------
    ::

        error = None
        try:
            loss = elbo.loss_and_grads(model, guide, x, y)
        except ValueError as caught:
            error = caught
        raise_if_any_rank_failed(error)   # every rank raises together, or none does
    """
    failed = torch.tensor([0.0 if error is None else 1.0], device=collective_device())
    dist.all_reduce(failed)
    if failed.item() == 0:
        return
    messages = [None] * dist.get_world_size()
    dist.all_gather_object(messages, None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    rank, message = next((r, m) for r, m in enumerate(messages) if m is not None)
    raise ValueError(f"rank {rank} failed, so every rank stops: {message}")


def combine_gradients(local_batch: int, loss: float) -> tuple[float, int]:
    """Collective: replace each gradient by ``sum_r (b_r / G) grad_r``; returns the global loss ``sum_r (b_r / G)
    loss_r`` and ``G``. Parameters without a gradient on this rank contribute zeros.

    Examples
    --------
    ::

        loss = elbo.loss_and_grads(model, guide, x, y)       # pyro_bbb.ELBO(num_data=N) on this rank's batch
        global_loss, G = combine_gradients(x.shape[0], loss)
        optimizer(params)                                    # the same update on every rank
    """
    params = [p for _, p in _named_parameters()]
    grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) * local_batch for p in params]
    counts = torch.tensor([float(local_batch), local_batch * loss], device=params[0].device)
    flat = torch.cat([*grads, counts])
    dist.all_reduce(flat)
    total, weighted_loss = flat[-2].item(), flat[-1].item()
    flat = flat[:-2] / total
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].reshape(p.shape).clone()
        offset += n
    return weighted_loss / total, int(round(total))


def all_reduce_sum(values: dict[str, float]) -> dict[str, float]:
    """Collective: the sum over ranks of each value (a fixed key order on every rank).

    Examples
    --------
    ::

        totals = all_reduce_sum({"nll": batch * nll, "seen": batch})   # then totals["nll"] / totals["seen"]
    """
    keys = sorted(values)
    tensor = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=collective_device())
    dist.all_reduce(tensor)
    return dict(zip(keys, tensor.tolist(), strict=True))
