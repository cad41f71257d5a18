"""A training step's figures: the one definition the trainer writes and every reader reads.

The trainer fills it (trainer/policy_model.py: the loss; trainer/models.py: the batch and
the timings; trainer/stepper.py: the read), the store keeps it as the step's JSON, and the
health check, the drift report, /metrics, the dashboard, the trackers, Langfuse and the admin
API read it back from here. docs/trainer.md says what each figure means.

Steps recorded by an older trainer lack the figures added since: they read as the defaults
below (``None`` where a zero would say something false, as an entropy of 0 would).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from burnish_server.core.learning.drift import REASONS


class StepMetrics(msgspec.Struct, kw_only=True):
    # The loss and its parts, normalised by the step's trained tokens (docs/trainer.md).
    loss: float = 0.0
    kl: float = 0.0
    clip_fraction: float = 0.0
    grad_norm: float = 0.0
    # Each objective (core/learning/policies.py: Objective): its loss, unweighted, and the tokens it
    # trained on (a token may count for several). ``loss`` is their weighted sum.
    grpo_loss: float = 0.0
    grpo_tokens: float = 0.0
    sft_loss: float = 0.0  # mean negative log-likelihood of the demonstration tokens
    sft_tokens: float = 0.0  # the demonstration tokens trained
    teacher_kl: float = 0.0  # mean log(policy / teacher) of the sampled tokens the teacher scored: the reverse KL's estimate
    distill_tokens: float = 0.0  # the sampled tokens the teacher scored and the step distilled
    teacher_unrendered_calls: int = 0  # calls the teacher could not be shown faithfully (trainer/teacher.py): not distilled
    teacher_requests: int = 0  # to a teacher vLLM serves (serving/scoring.py), each scoring many calls
    # Pairs of sequences the teacher scored, one rewarded above its baseline and one below, and
    # those it ranks the other way (trainer/teacher.py: teacher_against_rewards).
    teacher_pairs: int = 0
    teacher_pairs_against: int = 0
    # What it trained on.
    groups: int = 0  # groups trained, lone attempts included
    lone: int = 0  # lone attempts trained (groups of one), each against its kind's baseline (core/learning/lone.py)
    sequences: float = 0.0  # token sequences trained (a trajectory that split is several)
    tokens: float = 0.0  # sampled tokens trained
    forced_tokens: float = 0.0  # sampled tokens left out (past max_seq_len, or masked)
    held_tokens: float = 0.0  # trained tokens sampled under a grammar: their ratio is against the trainer's own logprob
    reward_mean: float | None = None  # the mean of the rewards trained on (the train reward)
    reward_std: float | None = None  # ... and their spread
    call_rewards: int = 0  # calls with a reward of their own (rewards per turn)
    untokenized_calls: int = 0  # calls the trainer could not tokenise faithfully: skipped
    stale_calls: int = 0  # calls older than max_staleness: skipped
    sequence_splits: int = 0  # calls whose prompt did not extend their trajectory's sequence
    # ... by reason (core/learning/drift.py): split_<reason> for every reason in REASONS.
    split_another_model: float = 0.0
    split_system_changed: float = 0.0
    split_prompt_cut: float = 0.0
    split_history_rewritten: float = 0.0
    split_tool_call_rerendered: float = 0.0
    split_reasoning_dropped: float = 0.0
    split_retokenized: float = 0.0
    # How on-policy the samples were: the trainer's logprobs against vLLM's, on the tokens
    # that have recorded ones, and the versions between sampling and training.
    logprob_diff_mean: float = 0.0
    outside_clip_fraction: float = 0.0
    tis_capped_fraction: float = 0.0
    mismatch_kl: float = 0.0  # KL(vLLM's sampling distribution || the trainer's), k3 on the sampled tokens
    staleness_mean: float = 0.0  # steps between the version that sampled a call and the one trained, mean
    staleness_max: int = 0  # ... and most
    # Learning health (core/learning/health.py): entropy on the sampled tokens; how far the adapter
    # moved the weights from the base's (relative Frobenius norm).
    entropy: float | None = None
    distance_from_base: float | None = None
    ranks: int = 1  # trainer processes that trained the step together
    # Where the time went, in seconds: the whole step (load to save), and its parts.
    seconds: float | None = None
    seconds_read: float = 0.0  # reading the groups' calls from the store
    seconds_load: float = 0.0  # loading the policy's adapter and optimizer state (0 when kept loaded)
    seconds_batch: float = 0.0  # tokenising the calls into sequences
    seconds_step: float = 0.0  # the forward and backward passes and the optimizer's update
    seconds_teacher: float = 0.0  # the teacher's scoring: its forward passes (within seconds_step), or its requests to vLLM
    seconds_save: float = 0.0  # writing the checkpoint and the adapter vLLM loads

    @classmethod
    def read(cls, stored: Any) -> StepMetrics:
        """A step's figures as the store keeps them (JSON), whichever trainer version wrote them."""
        return msgspec.convert(stored or {}, cls, strict=False)

    def count_splits(self, reasons: dict[str, int]) -> None:
        """Set split_<reason> from a count per reason (every reason: 0 where none)."""
        for reason in REASONS:
            setattr(self, f"split_{reason}", float(reasons.get(reason, 0)))

    def splits(self) -> dict[str, int]:
        """The step's splits by reason."""
        return {reason: int(getattr(self, f"split_{reason}")) for reason in REASONS}

    def figures(self) -> dict[str, float]:
        """Every figure by name, as the metrics history, the trackers and Langfuse show them."""
        return {name: value for name, value in msgspec.structs.asdict(self).items() if value is not None}


def split_totals(history: Iterable[StepMetrics]) -> dict[str, int]:
    """Steps -> the splits they trained, by reason (every reason, once there is a step)."""
    totals: dict[str, int] = {}
    for metrics in history:
        for reason, count in metrics.splits().items():
            totals[reason] = totals.get(reason, 0) + count
    return totals
