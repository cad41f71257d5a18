"""Is a policy's training run healthy? Read from its steps' metrics, oldest first.

Three figures a user can act on, beside the held-out score:

    reward trend   the train reward of the last steps against that of the first ones
                   (the first steps' samples come from the base or near it: its reward)
    entropy        the policy's entropy on the tokens it sampled, first steps against last:
                   a run that collapses drives it toward 0 (every sample the same)
    distance       how far the adapter has moved the weights it adapts (||delta W|| / ||W||)

and one warning, where nothing the last groups hold can train (members unrewarded, one
member a group), or where the run looks like it is collapsing: entropy fallen below a
fifth of where it started (unless the last steps mostly imitated or distilled, which narrow
the policy onto the teacher's answers by design), or climbed well above the base's (each
step pushes down what the policy samples without showing it where to go), the train reward
fallen below where it started by more than half of the first steps' spread of rewards, or most of the last groups tied (every member
rewarded alike); or where the last steps were off-policy though trained on their own
version's samples (a wrong checkpoint served, engines that disagree); or where the signal itself
is suspect: the next-message judge answers neither yes nor no to many answers, or the teacher
ranks answers against their rewards. Ties are read from the
groups, not the steps: a tied group teaches nothing and is never trained, so a policy that
answers alike every time stops making steps, and its steps' metrics stop changing just when
it matters.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from burnish_server.core.learning.steps import StepMetrics

# Steps averaged at each end of the run.
WINDOW = 3
# Warn when the last steps' entropy is below this share of the first steps'.
ENTROPY_FLOOR = 0.2
# Warn when the last steps' entropy is above this multiple of the first step's (the base's
# samples): a teacher on the sampled token alone climbed 1.9 -> 3.5 nats over 6-8 steps on a
# form the policy never sampled; its top 16 peaked at 1.5x on the way to learning it.
ENTROPY_CEILING = 1.6
# Warn when the last steps' reward is below the first steps' by this many of their spreads.
REWARD_DROP = 0.5
# Warn when at least this share of the last closed groups (at least TIES_MIN_GROUPS of them) tied.
TIES_SHARE = 0.75
TIES_MIN_GROUPS = 8
# Warn when the next-message judge answered neither yes nor no to at least this share of the
# answers it was asked about (at least JUDGE_MIN_ASKED of them): its rewards are few, and noise.
JUDGE_UNREADABLE_SHARE = 0.25
JUDGE_MIN_ASKED = 8
# Warn when, over the last WINDOW steps, the teacher ranked at least this share of its pairs of
# answers (one rewarded above its baseline, one below; at least TEACHER_MIN_PAIRS of them) the
# other way from the rewards: a teacher that knows nothing of them ranks about half so.
TEACHER_AGAINST_SHARE = 0.6
TEACHER_MIN_PAIRS = 16
# Warn when each of the last WINDOW steps, all trained on calls their own version sampled
# (staleness 0), had more than this share of tokens whose ratio to vLLM's logprob was outside
# the clip range: at staleness 0 it is 0 but for the engines' noise (docs/health.md).
OFF_POLICY_SHARE = 0.03


class RecentGroups(msgspec.Struct, frozen=True, kw_only=True):
    """The policy's last closed groups (held-out ones apart): how many, how many tied (every
    member rewarded alike) and the tied ones' mean reward, and how many can never train for
    want of rewards (``unrewarded``, lone attempts that expired included) or of a second member
    where the policy does not train lone attempts (``lone``)."""

    groups: int
    tied: int
    tied_reward: float | None = None
    unrewarded: int = 0
    lone: int = 0


class Health(msgspec.Struct, kw_only=True):
    steps: int
    reward_first: float | None  # mean train reward of the first WINDOW steps
    reward_last: float | None  # ... and of the last WINDOW steps
    reward_trend: float | None  # last - first
    entropy_first: float | None
    entropy_last: float | None
    distance_from_base: float | None  # at the last step
    recent_groups: int = 0  # the last closed groups looked at for ties
    recent_tied: int = 0
    recent_unrewarded: int = 0  # ... of which closed with a member unrewarded
    recent_lone: int = 0  # ... of which had one member
    # The next-message judge's verdicts: answers it scored, and those it answered neither yes nor no.
    judged: int = 0
    judge_unreadable: int = 0
    # The last WINDOW steps' pairs of answers the teacher scored, and those it ranked against the rewards.
    teacher_pairs: int = 0
    teacher_pairs_against: int = 0
    warning: str | None = None


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]  # None: a step from before the figure existed
    return sum(known) / len(known) if known else None


def health(history: Sequence[StepMetrics], ties: RecentGroups | None = None, judged: int = 0, unreadable: int = 0) -> Health:
    """``history``: each step's metrics, oldest first; ``ties``: the last closed groups;
    ``judged`` and ``unreadable``: the next-message judge's verdicts so far."""
    first, last = history[:WINDOW], history[-WINDOW:]
    reward_first, reward_last = _mean([m.reward_mean for m in first]), _mean([m.reward_mean for m in last])
    entropy_first, entropy_last = _mean([m.entropy for m in first]), _mean([m.entropy for m in last])
    out = Health(
        steps=len(history),
        reward_first=reward_first,
        reward_last=reward_last,
        reward_trend=None if reward_first is None or reward_last is None else reward_last - reward_first,
        entropy_first=entropy_first,
        entropy_last=entropy_last,
        distance_from_base=history[-1].distance_from_base if history else None,
        recent_groups=ties.groups if ties else 0,
        recent_tied=ties.tied if ties else 0,
        recent_unrewarded=ties.unrewarded if ties else 0,
        recent_lone=ties.lone if ties else 0,
        judged=judged,
        judge_unreadable=unreadable,
        teacher_pairs=sum(m.teacher_pairs for m in last),
        teacher_pairs_against=sum(m.teacher_pairs_against for m in last),
    )
    if ties is not None and ties.groups and ties.unrewarded + ties.lone == ties.groups:
        # Nothing the last groups hold can train, whatever the run's figures say: the first thing
        # a new user meets (docs/your-agent.md, "Nothing trains?").
        why = []
        if ties.unrewarded:
            why.append(f"{ties.unrewarded} closed with members that have no reward (post one for every member, or let RULER score them)")
        if ties.lone:
            why.append(f"{ties.lone} had a single member while train.lone_baseline is off (set it, or give each task several attempts in one group)")
        out.warning = f"nothing to train: of the last {ties.groups} closed groups, " + "; ".join(why)
        return out
    asked = judged + unreadable
    if asked >= JUDGE_MIN_ASKED and unreadable >= JUDGE_UNREADABLE_SHARE * asked:
        out.warning = (
            f"the next-message judge answered neither yes nor no to {unreadable} of the {asked} answers it was asked about, "
            "so few of them get a reward: name a stronger judge (ruler.judge_model) or turn it off (ruler.next_message false)"
        )
        return out
    pairs, against = out.teacher_pairs, out.teacher_pairs_against
    if pairs >= TEACHER_MIN_PAIRS and against >= TEACHER_AGAINST_SHARE * pairs:
        out.warning = (
            f"the teacher disagrees with the rewards: in the last steps it preferred the lower-rewarded answer in {against} of "
            f"{pairs} pairs ({against / pairs:.0%}), so distillation pulls against GRPO. Check that the rewards say what you "
            'want; under hindsight, that the next turns say what was wanted (else {"train": {"objective": "grpo", "teacher": null}})'
        )
        return out
    if ties is not None and ties.groups >= TIES_MIN_GROUPS and ties.tied >= TIES_SHARE * ties.groups:
        reward = f" (their reward {ties.tied_reward:.3f})" if ties.tied_reward is not None else ""
        out.warning = (
            f"no contrast left: {ties.tied} of the last {ties.groups} groups rewarded every member alike{reward}, so nothing is trained. "
            "If that reward is the best there is, the task is learned; if not, the policy has collapsed onto one answer "
            "(sample at a higher temperature, lower the learning rate, or roll back)"
        )
    fresh = [m.outside_clip_fraction for m in last if m.staleness_max == 0]
    if out.warning is None and len(fresh) == WINDOW and min(fresh) > OFF_POLICY_SHARE:
        out.warning = (
            f"off-policy at staleness 0: {min(fresh):.0%} to {max(fresh):.0%} of the tokens' ratios to vLLM's logprobs outside the "
            "clip range in each of the last steps, where the version trained sampled every call. Likely: vLLM serves another "
            "checkpoint under the version's name (the policy's load_error), vLLM and the trainer differ in dtype or kernels "
            '(set tis_cap), or calls sampled under a grammar are compared with vLLM\'s logprobs (held_ratio "recorded")'
        )
    if len(history) <= WINDOW:  # the two ends overlap: too early to say
        return out
    taught = sum(m.sft_tokens + m.distill_tokens for m in last) > sum(m.grpo_tokens for m in last)
    if out.warning is None and not taught and entropy_first and entropy_last is not None and entropy_last < ENTROPY_FLOOR * entropy_first:
        out.warning = (
            f"collapsing: the entropy on sampled tokens fell from {entropy_first:.3f} to {entropy_last:.3f}; "
            "the policy is sampling the same tokens every time (lower the learning rate, or roll back)"
        )
    base = history[0].entropy
    if out.warning is None and base and entropy_last is not None and entropy_last > ENTROPY_CEILING * base:
        out.warning = (
            f"drifting: the entropy on sampled tokens climbed from {base:.3f} to {entropy_last:.3f}; each step pushes down what "
            "the policy samples without showing it where to go (a teacher on the sampled token alone: set teacher.top_k, "
            "or have the teacher write answers; else lower the learning rate)"
        )
    spread = _mean([m.reward_std for m in first])
    if out.warning is None and out.reward_trend is not None and spread and out.reward_trend < -REWARD_DROP * spread:
        out.warning = (
            f"collapsing: the train reward fell from {reward_first:.3f} to {reward_last:.3f}, "
            f"more than {REWARD_DROP} of the first steps' spread ({spread:.3f}) (lower the learning rate, or roll back)"
        )
    return out
