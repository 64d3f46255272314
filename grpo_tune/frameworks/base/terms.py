"""The one rule set (:mod:`grpo_tune.core.rules`) speaks in grpo-tune's knob names and CLI flags (``pp=8``,
``--first-stage-layers``); a framework's diagnose reports the same finding in the user's terms: the role it is
about (verl's actor and ref, or its rollout; NeMo-RL's policy or its generation) and the keys of the user's own
file to change. Used by verl's and NeMo-RL's diagnose alike."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# the knob a core finding is about, by how its message starts (core/rules.py words every message this way)
_LEADS: tuple[tuple[str, str], ...] = (
    ("rollout_tp=", "rollout_tp"),
    ("tp*pp*cp", "tp"),
    ("ep*etp", "ep"),
    ("tp=", "tp"),
    ("pp=", "pp"),
    ("vpp", "vpp"),
    ("ep=", "ep"),
    ("uneven first/last", "first_stage_layers"),
    ("first/last stage layers", "first_stage_layers"),
)


def knob_of(message: str) -> str | None:
    for lead, knob in _LEADS:
        if message.startswith(lead):
            return knob
    return None


@dataclass(frozen=True)
class Terms:
    """How a framework names the roles and the keys of the knobs core's rules speak of."""

    train_role: str
    """The role whose degrees the rules check (verl: ``actor`` (and ``ref``, which takes its degrees))."""
    rollout_role: str
    keys: Mapping[str, str]
    """knob -> the framework key that sets it (tp, pp, vpp, cp, ep, etp, rollout_tp, first_stage_layers,
    last_stage_layers)."""
    uneven: str = ""
    """Extra words for a pipeline split the layers do not divide (verl: its account_for_* keys)."""

    def say(self, message: str, hint: str) -> tuple[str, str]:
        """``(message, hint)`` of a core finding, naming its role and hinting in this framework's keys."""
        knob = knob_of(message)
        if knob is None:
            return message, hint
        role = self.rollout_role if knob == "rollout_tp" else self.train_role
        message = f"{role}: {message}"
        if knob == "pp" and "layers of" in message:
            first, last = self.keys.get("first_stage_layers"), self.keys.get("last_stage_layers")
            hint = (
                f"set {first} and/or {last} for uneven stages{self.uneven}, or another "
                f"{self.keys.get('pp', 'pipeline size')}"
            )
            return message, hint

        def key(m: re.Match[str]) -> str:
            name = m.group(1)
            return f"set {self.keys.get(name, name)} to one of"

        hint = re.sub(r"use an? (\w+) among", key, hint)
        hint = re.sub(r"--([a-z-]+)", lambda m: self.keys.get(m.group(1).replace("-", "_"), m.group(0)), hint)
        return message, hint
