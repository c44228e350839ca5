import numpy as np
import pytest
from transformers import ByT5Tokenizer

from decentrain.algorithms.sapo.batching import (
    Arrival,
    ScoredGroup,
    SwarmBatchConfig,
    build_swarm_batch,
    tokenize_batch,
)
from decentrain.algorithms.sapo.payload import RolloutGroup


def grp(name: str, completions: tuple[str, ...], task: str = "t") -> RolloutGroup:
    return RolloutGroup(task=task, config="0" * 16, seed=0, size=10, index=0, question=name, completions=completions)


def reward_fn(a: Arrival) -> list[float]:
    """The receiver's verifier: 1 for a completion "1" (the answer); unknown tasks cannot be scored."""
    if a.group.task == "unknown":
        raise ValueError("task='unknown' is unknown")
    return [float(c == "1") for c in a.group.completions]


LOCAL = [Arrival(grp(f"l{i}", ("1", "0"))) for i in range(4)]
EXTERNAL = [
    Arrival(g, sender="peer")
    for g in (
        grp("all_right", ("1", "1")),  # equal rewards: dropped
        grp("all_wrong", ("0", "0")),  # equal rewards: dropped
        grp("bad_task", ("1", "0"), task="unknown"),  # unscorable: dropped
        grp("e0", ("1", "0")),
        grp("e1", ("0", "1")),
        grp("e2", ("1", "x")),
    )
]


def test_config_validation():
    with pytest.raises(ValueError, match=r"I\+J"):
        SwarmBatchConfig(num_local=0, num_external=0)
    with pytest.raises(ValueError, match="num_local"):
        SwarmBatchConfig(num_local=-1)
    allowed = r"allowed: \['uniform', 'reward_weighted'\]"
    with pytest.raises(ValueError, match=r"external_sampling='best' is unknown; " + allowed):
        SwarmBatchConfig(external_sampling="best")


def test_drops_equal_and_unscorable_external_groups():
    cfg = SwarmBatchConfig(num_local=2, num_external=2)
    batch = build_swarm_batch(LOCAL, EXTERNAL, reward_fn, cfg, np.random.default_rng(0))
    assert [g.group.question for g in batch.groups[:2]] == ["l0", "l1"]
    assert batch.num_local == 2 and batch.num_external == 2
    assert {g.group.question for g in batch.groups[2:]} <= {"e0", "e1", "e2"}
    assert all(g.external for g in batch.groups[2:]) and not any(g.external for g in batch.groups[:2])
    assert batch.stats == {"external_candidates": 6, "external_unscorable": 1, "external_equal_rewards": 2}
    # rewards are the receiver's own
    assert batch.groups[0].rewards == [1.0, 0.0]


def test_fewer_usable_than_j_uses_what_there_is():
    cfg = SwarmBatchConfig(num_local=1, num_external=8)
    batch = build_swarm_batch(LOCAL, EXTERNAL, reward_fn, cfg, np.random.default_rng(0))
    assert batch.num_external == 3 and len(batch.groups) == 4


def test_silo_ignores_external():
    batch = build_swarm_batch(LOCAL, EXTERNAL, reward_fn, SwarmBatchConfig(8, 0), np.random.default_rng(0))
    assert batch.num_local == 4 and batch.num_external == 0 and batch.stats["external_equal_rewards"] == 0


def test_draw_is_seeded_and_uniform_covers_all():
    cfg = SwarmBatchConfig(num_local=0, num_external=1)

    def draw(seed):
        return build_swarm_batch([], EXTERNAL, reward_fn, cfg, np.random.default_rng(seed)).groups[0]

    assert draw(3).group == draw(3).group
    assert {draw(s).group.question for s in range(40)} == {"e0", "e1", "e2"}


def test_reward_weighted_prefers_higher_mean_reward():
    # means .25 and .75
    ext = [Arrival(grp("low", ("1", "0", "0", "0")), "p"), Arrival(grp("high", ("1", "1", "1", "0")), "p")]
    cfg = SwarmBatchConfig(num_local=0, num_external=1, external_sampling="reward_weighted")
    rng = np.random.default_rng(0)
    picks = [build_swarm_batch([], ext, reward_fn, cfg, rng).groups[0].group.question for _ in range(400)]
    assert 0.65 < picks.count("high") / 400 < 0.85  # expected .75


def test_tokenize_batch_layout():
    tok = ByT5Tokenizer()
    groups = [
        ScoredGroup(grp("ab", ("1\n", "")), [1.0, 0.0], external=False),
        ScoredGroup(grp("abcd", ("22\n", "3")), [0.0, 1.0], external=True),
    ]
    tb = tokenize_batch(groups, tok, lambda q: f"Q:{q}\n", max_prompt_tokens=6, max_completion_tokens=2)
    assert tb.prompts == ["Q:ab\n", "Q:abcd\n"]
    assert tb.prompt_ids.shape == (4, 6) and tb.completion_ids.shape == (4, 2)
    # left-padded prompts, truncated from the left ("Q:abcd\n" is 7 bytes -> ":abcd\n")
    assert tb.prompt_mask.tolist() == [[0, 1, 1, 1, 1, 1]] * 2 + [[1] * 6] * 2
    assert tok.decode(tb.prompt_ids[2]) == ":abcd\n"
    # right-padded completions, truncated from the right ("22\n" -> "22"), empty completion is all padding
    assert tb.completion_mask.tolist() == [[1, 1], [0, 0], [1, 1], [1, 0]]
    assert tok.decode(tb.completion_ids[2]) == "22"
    assert tb.rewards.tolist() == [[1.0, 0.0], [0.0, 1.0]]
