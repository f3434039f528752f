"""0.5.23's Domino rollout (`domino_greedy_rollout`, loaded without importing the `sglang`
package: `domino_utils.py` imports only torch), random rollout modules, and a fake
tensor-parallel group: ranks are threads exchanging shards in process."""

from __future__ import annotations

import importlib.util
import os
import threading

import torch
from torch import nn


def _load_domino_utils():
    spec = importlib.util.find_spec("sglang")
    path = os.path.join(spec.submodule_search_locations[0], "srt", "speculative", "domino_utils.py")
    mod_spec = importlib.util.spec_from_file_location("_sglang_domino_utils_0523", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


du = _load_domino_utils()


class Exchange:
    """`world` ranks (threads) handing each other one tensor each, in rank order."""

    def __init__(self, world: int):
        self.world = world
        self.barrier = threading.Barrier(world, timeout=60)
        self.slots = [None] * world

    def gather(self, rank: int, tensor: torch.Tensor) -> list[torch.Tensor]:
        self.slots[rank] = tensor.clone()
        self.barrier.wait()
        parts = list(self.slots)
        self.barrier.wait()
        return parts


class FakeGroup:
    """The three collectives `domino_greedy_rollout` uses, over in-process shards."""

    def __init__(self, exchange: Exchange, rank: int):
        self.exchange, self.rank, self.world_size = exchange, rank, exchange.world
        self.calls = []

    def all_gather_into_tensor(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self.calls.append("all_gather")
        out.copy_(torch.cat(self.exchange.gather(self.rank, inp), dim=0).view_as(out))

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        self.calls.append("all_reduce")
        return torch.stack(self.exchange.gather(self.rank, tensor)).sum(0)


V, H, G, E = 97, 16, 8, 6  # odd vocab: the last shard is padded


def run_ranks(world: int, fn, group_cls=None):
    """fn(rank, group) on `world` threads sharing one fake group (`group_cls`, FakeGroup by
    default); their results and groups, the first error raised."""
    exchange = Exchange(world)
    outs, groups, errors = [None] * world, [None] * world, []

    def run(rank):
        try:
            groups[rank] = (group_cls or FakeGroup)(exchange, rank)
            outs[rank] = fn(rank, groups[rank])
        except BaseException as err:   # surfaced below
            errors.append(err)
            exchange.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return outs, groups


def rollout_modules(seed=0):
    """Random (lm_head, embedding, prefix GRU, correction head) of a Domino draft, float64."""
    torch.manual_seed(seed)
    lm_head = torch.randn(V, H, dtype=torch.float64)
    embed = nn.Embedding(V, H).double()
    gru = nn.GRU(H, G, bias=False, batch_first=True).double()
    proj = nn.Sequential(nn.Linear(H + G, E, bias=False), nn.SiLU(), nn.Linear(E, V, bias=False)).double()
    with torch.no_grad():
        proj[2].weight.mul_(4.0)  # corrections large enough to change the chain
    return lm_head, embed, gru, proj


def rollout_block(bs: int, block: int, seed: int):
    """Random rollout modules (`rollout_modules(seed)`) with a block of draft hidden states
    [bs, block, H] (float64) and block input ids [bs, block] (the bonus token in slot 0)."""
    mods = rollout_modules(seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    hidden = torch.randn(bs, block, mods[0].shape[1], generator=g, dtype=torch.float64)
    ids = torch.randint(0, V, (bs, block), generator=g)
    return mods, hidden, ids
