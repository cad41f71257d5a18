"""A run's learning health from its steps' metrics (core/learning/health.py)."""

from __future__ import annotations

from burnish_server.core.learning.health import RecentGroups, health
from burnish_server.core.learning.steps import StepMetrics
from tests.conftest import Gateway


def steps(rewards: list[float], entropies: list[float], std: float = 0.2) -> list[StepMetrics]:
    return [StepMetrics(reward_mean=r, reward_std=std, entropy=e, distance_from_base=i / 100) for i, (r, e) in enumerate(zip(rewards, entropies))]


def test_a_run_that_learns_is_healthy() -> None:
    h = health(steps([0.2, 0.25, 0.3, 0.5, 0.6, 0.7], [1.5, 1.4, 1.4, 1.2, 1.1, 1.0]))
    assert h.warning is None and h.steps == 6 and h.distance_from_base == 0.05
    assert round(h.reward_trend or 0, 3) == 0.35 and h.entropy_first == 1.4333333333333333


def test_entropy_fallen_below_a_fifth_of_its_start_warns() -> None:
    h = health(steps([0.2, 0.3, 0.3, 0.4, 0.4, 0.4], [1.5, 1.5, 1.5, 0.2, 0.1, 0.1]))
    assert h.warning is not None and h.warning.startswith("collapsing: the entropy on sampled tokens fell from 1.500 to 0.133")


def test_entropy_fallen_while_imitating_or_distilling_is_no_collapse() -> None:
    taught = [StepMetrics(reward_mean=0.2, reward_std=0.2, entropy=e, distill_tokens=100, grpo_tokens=0) for e in (1.9, 2.9, 3.1, 0.9, 0.5, 0.2)]
    assert health(taught).warning is None  # the house-style run's top-k route (docs/objectives.md)


def test_entropy_climbing_well_above_the_bases_warns() -> None:
    # The sampled-token teacher on a form never sampled (docs/notes/learning-runs.md), and its top 16.
    sampled_only = [StepMetrics(entropy=e, distill_tokens=100) for e in (1.91, 2.80, 3.57, 3.21, 3.78, 3.88)]
    warning = health(sampled_only).warning
    assert warning is not None and warning.startswith("drifting: the entropy on sampled tokens climbed from 1.910 to 3.623") and "top_k" in warning
    top_16 = [StepMetrics(entropy=e, distill_tokens=100) for e in (1.91, 2.94, 3.12, 2.39, 1.80, 0.94)]
    assert all(health(top_16[:n]).warning is None for n in range(1, 7))


def test_a_reward_fallen_by_half_the_first_spread_warns() -> None:
    h = health(steps([0.5, 0.5, 0.5, 0.3, 0.3, 0.3], [1.0] * 6, std=0.2))
    assert h.warning is not None and "train reward fell from 0.500 to 0.300" in h.warning
    assert health(steps([0.5, 0.5, 0.5, 0.45, 0.45, 0.45], [1.0] * 6, std=0.2)).warning is None  # within the spread


def test_too_early_to_say_and_no_steps() -> None:
    assert health(steps([0.5, 0.1, 0.1], [1.0, 0.01, 0.01])).warning is None
    empty = health([])
    assert (empty.steps, empty.reward_trend, empty.warning) == (0, None, None)


def test_off_policy_at_staleness_0_warns_with_its_likely_causes() -> None:
    fresh = [StepMetrics(outside_clip_fraction=share, staleness_max=0) for share in (0.0, 0.2, 0.25, 0.12)]
    warning = health(fresh).warning
    assert warning is not None and warning.startswith("off-policy at staleness 0: 12% to 25%") and "held_ratio" in warning
    # One step in range, or a stale step (the policy moved since it sampled): no warning.
    assert health([*fresh[:-1], StepMetrics(outside_clip_fraction=0.01)]).warning is None
    assert health([*fresh[:-1], StepMetrics(outside_clip_fraction=0.3, staleness_max=2)]).warning is None


def test_most_of_the_last_groups_tied_warns_even_without_steps() -> None:
    """A policy that answers alike every time makes tied groups, which are never trained: no
    step shows it, the groups do."""
    collapsed = health(steps([0.3, 0.5], [1.7, 0.8]), RecentGroups(groups=16, tied=14, tied_reward=0.4))
    assert collapsed.warning is not None and collapsed.warning.startswith("no contrast left: 14 of the last 16 groups") and "0.400" in collapsed.warning
    assert (collapsed.recent_groups, collapsed.recent_tied) == (16, 14)
    assert health([], RecentGroups(groups=16, tied=11)).warning is None  # under three quarters
    assert health([], RecentGroups(groups=7, tied=7)).warning is None  # too few to say


def test_a_policy_whose_groups_tie_says_so_in_its_status(gateway: Gateway) -> None:
    gateway.create_policy("agent")
    chat = {"model": "agent", "messages": [{"role": "user", "content": "hi"}]}

    def group(name: str, rewards: tuple[float, float]) -> None:
        with gateway.client() as c:
            for i, reward in enumerate(rewards):
                assert c.post(f"/g/{name}/t/{name}-{i}/v1/chat/completions", json=chat, headers={"x-group-size": "2"}).status_code == 200
                assert c.post(f"/v1/trajectories/{name}-{i}/reward", json={"reward": reward}).status_code == 200

    for g in range(3):
        group(f"apart-{g}", (0.0, 1.0))
    for g in range(5):
        group(f"alike-{g}", (0.5, 0.5))
    assert gateway.policy()["health"]["warning"] is None  # 5 of 8: not yet
    for g in range(5, 10):
        group(f"alike-{g}", (0.5, 0.5))
    status = gateway.policy()["health"]
    assert (status["recent_groups"], status["recent_tied"]) == (13, 10) and status["warning"].startswith("no contrast left: 10 of the last 13 groups")


def test_a_judge_that_answers_neither_yes_nor_no_warns() -> None:
    learning = steps([0.2, 0.25, 0.3, 0.5], [1.5, 1.4, 1.4, 1.2])
    assert health(learning, judged=30, unreadable=5).warning is None  # a few, among many verdicts
    warning = health(learning, judged=6, unreadable=4).warning
    assert warning is not None and "answered neither yes nor no to 4 of the 10 answers" in warning and "ruler.judge_model" in warning


def test_a_teacher_that_ranks_answers_against_their_rewards_warns() -> None:
    def taught(pairs: int, against: int) -> list[StepMetrics]:
        return [StepMetrics(reward_mean=0.5, reward_std=0.2, entropy=1.0, teacher_pairs=pairs, teacher_pairs_against=against)] * 4

    assert health(taught(10, 5)).warning is None  # a teacher that knows nothing of the rewards: about half
    h = health(taught(10, 8))
    assert (h.teacher_pairs, h.teacher_pairs_against) == (30, 24)
    assert h.warning is not None and h.warning.startswith("the teacher disagrees with the rewards") and "24 of 30 pairs (80%)" in h.warning
