"""A policy's settings changed as an admin asks: a PATCH merged key by key with the policy as it
stands, and settings that could never do what they configure refused (for the admin API and the
dashboard alike)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from burnish_server.core.learning.policies import LoraSettings, Policy, PromotionSettings, RulerSettings, ServingSettings, TrainSettings, settings_conflicts
from burnish_server.core.platform.access import PRINTABLE, ProjectName
from burnish_server.core.platform.errors import Invalid
from burnish_server.gateway.edge import openapi

BaseModel = Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=PRINTABLE)]
ModelPath = Annotated[str, msgspec.Meta(min_length=1, max_length=1024, pattern=PRINTABLE)]


class PolicyPatch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Fields left out stay as they are; ``lora``, ``train``, ``ruler``, ``promotion`` and ``serving`` are merged key by key."""

    base_model: BaseModel | msgspec.UnsetType = msgspec.UNSET
    model_path: ModelPath | None | msgspec.UnsetType = msgspec.UNSET
    lora: Annotated[dict[str, Any], openapi.documented_as(LoraSettings)] | msgspec.UnsetType = msgspec.UNSET
    train: Annotated[dict[str, Any], openapi.documented_as(TrainSettings)] | msgspec.UnsetType = msgspec.UNSET
    ruler: Annotated[dict[str, Any], openapi.documented_as(RulerSettings)] | msgspec.UnsetType = msgspec.UNSET
    promotion: Annotated[dict[str, Any], openapi.documented_as(PromotionSettings)] | msgspec.UnsetType = msgspec.UNSET
    serving: Annotated[dict[str, Any], openapi.documented_as(ServingSettings)] | msgspec.UnsetType = msgspec.UNSET
    project: ProjectName | None | msgspec.UnsetType = msgspec.UNSET
    shared_with: Annotated[list[ProjectName], msgspec.Meta(max_length=1000)] | msgspec.UnsetType = msgspec.UNSET
    paused: bool | msgspec.UnsetType = msgspec.UNSET


def refuse_conflicts(policy: Policy, max_lora_rank: int) -> None:
    """Settings that could never do what they configure are refused, naming the fields and the
    smallest value that works (core/learning/policies.py: settings_conflicts)."""
    if found := settings_conflicts(policy.promotion, policy.lora, max_lora_rank or None, policy.train):
        raise Invalid("; ".join(found), "conflicting_settings", found[0].split(" ", 1)[0])


def _merge(current: msgspec.Struct, changes: dict[str, Any], kind: type[Any], key: str) -> Any:
    try:
        return msgspec.convert({**msgspec.to_builtins(current), **changes}, kind)
    except msgspec.ValidationError as exc:
        raise Invalid(f"invalid {key}: {exc}", f"invalid_{key}", key) from None


def patched(current: Policy, data: PolicyPatch, max_lora_rank: int = 0) -> dict[str, Any]:
    """The columns a PATCH changes, merged with the policy as it stands on its locked row
    (``store/controls.py: change_policy``), so two PATCHes of different keys both stand; the
    merged settings are checked as a whole (a change that makes them conflict is refused, and
    nothing is written)."""
    values: dict[str, Any] = {k: getattr(data, k) for k in ("base_model", "model_path", "project", "paused") if getattr(data, k) is not msgspec.UNSET}
    if data.shared_with is not msgspec.UNSET:
        values["shared_with"] = list(dict.fromkeys(data.shared_with))
    for key, kind in (
        ("lora", LoraSettings),
        ("train", TrainSettings),
        ("ruler", RulerSettings),
        ("promotion", PromotionSettings),
        ("serving", ServingSettings),
    ):
        if (changes := getattr(data, key)) is not msgspec.UNSET:
            values[key] = _merge(getattr(current, key), changes, kind, key)
    if {"promotion", "lora", "train"} & values.keys():
        refuse_conflicts(msgspec.structs.replace(current, **{k: v for k, v in values.items() if k in ("promotion", "lora", "train")}), max_lora_rank)
    return values
