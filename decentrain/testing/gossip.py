"""What the gossip tests compute on each rank."""

from __future__ import annotations


def average(exchange, tensors, group, round_idx):
    """The group mean of `tensors` over a PairExchange (None when the exchange failed): what NoLoCo forms."""
    from decentrain.algorithms.noloco.noloco import group_mean

    partners = exchange.exchange(tensors, group, round_idx)
    return None if partners is None else group_mean(list(tensors), partners)
