"""Tensor parallelism for kvoffload.hf: which KV heads this rank's cache holds, and the ranks'
agreement on one plan.

transformers shards a model loaded with ``tp_plan="auto"`` (or ``distributed_config``) over the
ranks of ``torch.distributed``, and records it in the model's config (``config.distributed_config``,
``tp_size``); its plan shards attention by KV heads, ``k_proj`` and ``v_proj`` column-wise, so that
rank r computes, and caches, KV heads [r * kv_heads / tp, (r + 1) * kv_heads / tp). A layer whose
key projection the plan leaves whole (multi-head latent attention in DeepSeek V2/V3: its latent is
one "head") caches the same rows on every rank: replicated.

What this module reads: the config (never the caller) for the plan and tp_size; torch.distributed
for the rank; the launcher's ``LOCAL_WORLD_SIZE`` for the ranks that share this node's memory.
Collectives are issued by every rank whatever happened on it before (``agree_range``,
``all_succeeded``): one ``all_reduce(MIN)`` to plan the cache and one after allocating it; one
after saving; to load, one on reading the files, one on their sizes and one after restoring the
rows, besides building the cache. A rank that cannot plan, allocate, save or restore thus makes every rank
raise instead of leaving the others waiting.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

# transformers' plan styles that split a projection's output features (its heads) over the ranks.
_COLUMN_STYLES = ("colwise", "colwise_rep", "local_colwise", "colwise_gather_output")
# A layer's key projections in the transformers families this cache serves; an entry for one of
# these other than k_proj (a fused projection) is a layout this module does not read.
_KEY_PROJECTIONS = ("k_proj", "v_proj", "qkv_proj", "query_key_value", "c_attn", "kv_proj",
                    "Wqkv", "kv_a_proj_with_mqa", "kv_b_proj")


class TensorParallelError(ValueError):
    """This cache cannot serve the model as transformers shards it; the message says why."""


@dataclass(frozen=True)
class Shard:
    """This process's part: rank ``rank`` of ``world_size`` tensor-parallel ranks, of which
    ``ranks_per_node`` share this node's host memory. ``sharded``: attention is split by KV heads
    (the cache holds KV heads [kv_head_begin, kv_head_begin + kv_heads) of model_kv_heads); else
    every rank holds every head (one process, or replicated attention)."""

    rank: int = 0
    world_size: int = 1
    ranks_per_node: int = 1
    sharded: bool = False
    kv_head_begin: int = 0
    kv_heads: int = 0
    model_kv_heads: int = 0

    @property
    def parallel(self) -> bool:
        return self.world_size > 1


def _tp_size(config, text_config) -> int:
    for c in (config, text_config):
        distributed = getattr(c, "distributed_config", None)
        size = getattr(distributed, "tp_size", None) if distributed is not None else None
        if size:
            return int(size)
    return 1


def _tp_plan(config, text_config) -> dict:
    plan = {}
    for c in (text_config, config):
        entries = getattr(c, "base_model_tp_plan", None)
        if isinstance(entries, dict):
            plan.update(entries)
        distributed = getattr(c, "distributed_config", None)
        entries = getattr(distributed, "tp_plan", None) if distributed is not None else None
        if isinstance(entries, dict):
            plan.update(entries)
    return plan


def _heads_sharded(config, text_config) -> bool:
    """Whether transformers' plan splits the layers' KV heads over the ranks: k_proj column-wise.
    Raises for a key projection it shards in a way this module does not read."""
    plan = _tp_plan(config, text_config)
    keys = {name: style for name, style in plan.items()
            if name.rsplit(".", 1)[-1] in _KEY_PROJECTIONS}
    if not keys:
        return False  # attention replicated on every rank
    for name, style in keys.items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in ("k_proj", "v_proj") or style not in _COLUMN_STYLES:
            raise TensorParallelError(
                f"the model's tensor-parallel plan shards '{name}' as '{style}'; kvoffload reads "
                "plans that split k_proj and v_proj column-wise (by KV heads) or leave attention "
                "whole")
    return True


def find_shard(config, text_config, kv_heads: int | None, has_states: bool) -> Shard:
    """This process's Shard, from the model's config and torch.distributed. ``kv_heads``: the
    model's KV heads per offloaded layer (else per window layer; None: no such layer)."""
    tp = _tp_size(config, text_config)
    if tp <= 1:
        return Shard(kv_heads=kv_heads or 0, model_kv_heads=kv_heads or 0)
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise TensorParallelError(
            f"the model was sharded over {tp} tensor-parallel ranks but torch.distributed is not "
            "initialized in this process: build the cache in the ranks that run the model")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != tp:
        raise TensorParallelError(
            f"torch.distributed has {world} ranks and the model {tp} tensor-parallel ones: "
            "kvoffload serves tensor parallelism over every rank, not combined with data, "
            "pipeline or fully sharded parallelism")
    ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if not 1 <= ranks_per_node <= world:
        raise TensorParallelError(
            f"LOCAL_WORLD_SIZE is {ranks_per_node}; the launcher's ranks per node must be from 1 "
            f"to the world size, {world}")
    if has_states:
        raise TensorParallelError(
            "the model keeps fixed-size states (linear attention, convolutions or Mamba), and how "
            "transformers shards them over tensor-parallel ranks is not planned here: run it in "
            "one process")
    base = Shard(rank=rank, world_size=world, ranks_per_node=ranks_per_node,
                 kv_heads=kv_heads or 0, model_kv_heads=kv_heads or 0)
    if kv_heads is None or not _heads_sharded(config, text_config):
        return base
    if kv_heads % world:
        raise TensorParallelError(
            f"the model has {kv_heads} KV heads and runs on {world} tensor-parallel ranks: "
            f"transformers shards k_proj and v_proj column-wise, which splits a head over ranks "
            f"when kv_heads < tp (its own forward fails then, transformers issue #48307; it does "
            "not replicate KV heads) and is uneven when tp does not divide kv_heads. Run with a "
            f"tp that divides {kv_heads}")
    local = kv_heads // world
    return Shard(rank=rank, world_size=world, ranks_per_node=ranks_per_node, sharded=True,
                 kv_head_begin=rank * local, kv_heads=local, model_kv_heads=kv_heads)


def agree_range(shard: Shard, device: torch.device,
                values: list[int]) -> tuple[list[int], list[int]]:
    """The minimum and the maximum of each of ``values`` over the ranks, in one all_reduce(MIN)
    (of the values and their negations). Every rank calls it with as many values, whatever
    happened before."""
    if not shard.parallel:
        return list(values), list(values)
    import torch.distributed as dist

    on = torch.device("cpu")
    if dist.get_backend() == "nccl":  # NCCL reduces device tensors only
        on = device if device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    tensor = torch.tensor(values + [-v for v in values], dtype=torch.int64, device=on)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    reduced = [int(v) for v in tensor.tolist()]
    return reduced[:len(values)], [-v for v in reduced[len(values):]]


def all_succeeded(shard: Shard, device: torch.device, failure: BaseException | None,
                  what: str, error: type = RuntimeError) -> None:
    """After a step every rank takes that may fail on some ranks alone (an allocation, a file):
    one all_reduce, so that every rank raises if any failed, none goes on to wait for the
    others in the model's next collective. Raises ``failure`` where it happened, ``error``
    naming ``what`` elsewhere."""
    if failure is not None:
        agree_range(shard, device, [1])  # the others learn of it
        raise failure
    if agree_range(shard, device, [0])[1] != [0]:
        raise error(f"rank {shard.rank}: another tensor-parallel rank could not {what} (its own "
                    "error says why)")
