"""DRQ's descriptors and the MAP-Elites archive (pyribs)."""

from __future__ import annotations

from decentrain.algorithms.dei.archive import Archive, Elite, descriptor, merged_stats
from decentrain.algorithms.dei.redcode import parse


def _warrior(lines: list[str]):
    return parse("\n".join(lines)).warrior


def test_descriptors_use_drqs_bin_edges():
    # DRQ: unique opcodes on edges 4,6,8,10,14 and length on 5,12,20,35,60 (bin i: edges[i-1] <= v < edges[i])
    assert descriptor("pl", _warrior(["MOV 0, 1"] * 4)) == 0
    assert descriptor("pl", _warrior(["MOV 0, 1"] * 5)) == 1
    assert descriptor("pl", _warrior(["MOV 0, 1"] * 60)) == 5
    ops = ["MOV 0, 1", "ADD 0, 1", "SUB 0, 1", "JMP 0", "SPL 0"]
    assert descriptor("uo", _warrior(ops[:3])) == 0 and descriptor("uo", _warrior(ops)) == 1


def test_an_elite_is_replaced_only_by_a_fitter_warrior_of_its_cell():
    arch = Archive(("uo", "pl"), seed=0)
    a, b = _warrior(["MOV 0, 1"]), _warrior(["MOV 0, 2"])
    assert arch.add(a, 1.0)
    assert not arch.add(b, 0.5)
    assert arch.add(b, 1.5)
    assert len(arch) == 1 and arch.best().fitness == 1.5 and arch.best().text == b.render()
    assert arch.add(_warrior(["MOV 0, 1", "ADD 0, 1", "SUB 0, 1", "JMP 0", "SPL 0"]), 0.1)
    assert len(arch) == 2 and set(arch.sample(5)) <= {e.text for e in arch.elites()}


def test_merged_archive_keeps_the_best_per_cell():
    elites = [Elite("a", 1.0, (0, 0)), Elite("b", 2.0, (0, 0)), Elite("c", 0.5, (1, 0))]
    assert merged_stats(elites) == {"qd_score": 2.5, "coverage": 2 / 36, "cells": 2}
