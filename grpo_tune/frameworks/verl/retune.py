"""``tune`` on a verl launch with separate pools: the user's own launch edited to run the best separate plan.

The contract (docs/tune.md): tune changes only the keys it prices. For a separate plan those are the training
layout (the keys :func:`read.overrides_for` writes), the two pools (``trainer.*`` and ``rollout.*`` nodes and GPUs
per node) and the schedule (``async_training.staleness_threshold``, ``trigger_parameter_sync_step`` and
``partial_rollout``). Everything else (data, reward, optimizer, logging, the user's variables) stays byte for byte.

A one-step-off launch stays one-step-off while the plan is its schedule (staleness 1, no partial rollout, a sync
per step). A plan it cannot run (more staleness, partial rollout), or a colocated launch given separate pools,
switches the launch to verl 0.9.1's fully-async trainer in place: the module and ``--config-name`` words of the
user's command, plus the keys that trainer asserts (``fully_async_rollouter.py``: ``hybrid_engine=False``,
``data.train_batch_size=0``, ``data.gen_batch_size=1``, ``calculate_log_probs``; the rollout mode is ``async`` by
default) and the one that keeps the same length of run (``rollout.total_rollout_steps``). Every key
changed or added is listed.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import TYPE_CHECKING

from grpo_tune.frameworks.verl import fully_async, one_step_off, read
from grpo_tune.frameworks.verl.experimental import WheelConfig
from grpo_tune.frameworks.verl.table import ARO, ROLLOUT

if TYPE_CHECKING:
    from grpo_tune.core.config import RunConfig
    from grpo_tune.core.specs import ModelSpec
    from grpo_tune.frameworks.verl.launch import Launch

POOL_KEYS = ("trainer.nnodes", "trainer.n_gpus_per_node", "rollout.nnodes", "rollout.n_gpus_per_node")
ST, TRIGGER, PARTIAL = (
    "async_training.staleness_threshold",
    "async_training.trigger_parameter_sync_step",
    "async_training.partial_rollout",
)
_ENTRIES = ("verl.trainer.main_ppo", one_step_off.ENTRY)
_NAMES = ("ppo_megatron_trainer", one_step_off.CONFIG_NAME)


@dataclasses.dataclass
class SeparateEdit:
    """The edited launch: its text, the keys it changes or adds (key -> (old, new)), the trainer it runs."""

    text: str
    changes: dict[str, tuple[object, object]]
    trainer: WheelConfig
    switched: bool
    """The launch's trainer was replaced (one-step-off or colocated -> fully-async)."""
    notes: list[str]


def _same(a: object, b: object) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool | None):
        return not isinstance(b, bool) and math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b


def _switch_text(text: str) -> tuple[str, list[str]]:
    """The launch's command run by the fully-async trainer: its module and --config-name words replaced."""
    notes = []
    ent = "|".join(re.escape(e) for e in _ENTRIES)
    text, n = re.subn(rf"(-m\s+)({ent})(?=\s|$)", rf"\g<1>{fully_async.ENTRY}", text)
    if not n:
        notes.append(f"no `python3 -m` of a verl trainer found: run it with `python3 -m {fully_async.ENTRY}`")
    names = "|".join(re.escape(e) for e in _NAMES)
    text, n = re.subn(
        rf"(--config-name(?:=|\s+))(['\"]?)(?:{names})(\.yaml)?\2(?=\s|$)",
        rf"\g<1>\g<2>{fully_async.CONFIG_NAME}\g<3>\g<2>",
        text,
    )
    if not n:
        notes.append(f"no --config-name word found: pass --config-name={fully_async.CONFIG_NAME}")
    if re.search(r"--config-path(?:=|\s+)(?!['\"]?config['\"]?(\s|$))", text):
        notes.append(
            "--config-path names another folder: the fully-async config lives in "
            "verl/experimental/fully_async_policy/config (`--config-path=config` from its module)"
        )
    return text, notes


def separate_edit(launch: Launch, cfg: RunConfig, model: ModelSpec) -> SeparateEdit:
    """``launch`` edited to run the separate plan ``cfg``: only the keys tune prices, the trainer switched when the
    launch's cannot run the plan."""
    p, w = cfg.placement, cfg.workload
    pk = fully_async.pool_keys(cfg)
    new: dict[str, object] = dict(read.overrides_for(cfg.strategy, model, launch.get, set()))
    new.update({k: pk[k] for k in POOL_KEYS})
    one_step_plan = p.staleness == 1 and not p.partial_rollout and p.sync_interval == 1
    fa_launch = launch.separate and not launch.one_step
    switched = not (fa_launch or (launch.one_step and one_step_plan))
    trainer = one_step_off.CONFIG if (launch.one_step and not switched) else fully_async.CONFIG
    text, notes = launch.text, list[str]()
    if fa_launch:
        k_old = launch.get(ST)
        if not (isinstance(k_old, (int, float)) and math.ceil(float(k_old)) == p.staleness):
            new[ST] = pk[ST]
        new[TRIGGER], new[PARTIAL] = pk[TRIGGER], pk[PARTIAL]
    elif switched:
        text, notes = _switch_text(text)
        new.update(
            {
                # fully_async_rollouter.py asserts these (verl 0.9.1)
                f"{ARO}.hybrid_engine": False,
                "data.train_batch_size": 0,
                "data.gen_batch_size": 1,
                f"{ROLLOUT}.calculate_log_probs": True,
                # vLLM stays up and receives the weights by NCCL (the plan's sync)
                f"{ROLLOUT}.free_cache_engine": pk[f"{ROLLOUT}.free_cache_engine"],
                f"{ROLLOUT}.checkpoint_engine.backend": pk[f"{ROLLOUT}.checkpoint_engine.backend"],
                # the same workload: a parameter version per step of prompts (the responses per prompt stay the
                # user's actor_rollout_ref.rollout.n: the fully-async trainer reads that one, detach_utils.py)
                ST: pk[ST],
                TRIGGER: pk[TRIGGER],
                "async_training.require_batches": 1,
                PARTIAL: pk[PARTIAL],
                # the log-probs as the launch takes them (recomputed or the rollout's)
                "algorithm.rollout_correction.bypass_mode": pk["algorithm.rollout_correction.bypass_mode"],
            }
        )
        steps = launch.get("trainer.total_training_steps")
        if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0:
            new["rollout.total_rollout_steps"] = w.prompts * steps  # the fully-async trainer counts samples
        else:
            notes.append(
                "trainer.total_training_steps is not set: set rollout.total_rollout_steps (prompts, the fully-async "
                "trainer's length) yourself"
            )

    def effective(key: str) -> object:
        """The value the edited launch gives ``key`` before this edit: the user's, or the trainer's default."""
        if switched and key not in launch.values:
            return trainer.default(key)
        return launch.get(key)

    # old: the value the key has before the edit (a switched launch: the user's, or the new trainer's default)
    changes = {k: (effective(k), v) for k, v in new.items() if not _same(effective(k), v)}
    if switched and launch.one_step:
        notes.insert(0, "the plan is not verl's one-step-off schedule: the launch now runs the fully-async trainer")
    elif switched:
        notes.insert(0, "separate pools: the launch now runs verl's fully-async trainer")
        notes.append(
            "the fully-async config finds ppo_megatron_trainer through its hydra.searchpath "
            "file://verl/trainer/config: run it from a verl checkout, as verl's fully-async scripts do, or add "
            "'hydra.searchpath=[file://VERL_DIR/trainer/config]' (VERL_DIR: the installed verl package)"
        )
    return SeparateEdit(text=text, changes=changes, trainer=trainer, switched=switched, notes=notes)


def edited_launch(launch: Launch, edit: SeparateEdit) -> str:
    """tuned.sh: :func:`separate_edit`'s text with its keys written in place (script.py's rewrite), keys the
    trainer's config declares added without ``+``."""
    from grpo_tune.frameworks.verl.script import key_fixes, tuned_text

    base = dataclasses.replace(launch, text=edit.text)
    text = tuned_text(base, edit.changes, key_fixes(launch), declared=edit.trainer.declared)
    if not edit.switched:
        return text
    lines = text.split("\n")
    at = 1 if lines and lines[0].startswith("#!") else 0
    lines.insert(at, f"# grpo-tune tune: this launch now runs verl's fully-async trainer ({fully_async.ENTRY})")
    return "\n".join(lines)


SWITCH_KEYS = (
    f"{ARO}.hybrid_engine",
    "data.train_batch_size",
    "data.gen_batch_size",
    f"{ROLLOUT}.calculate_log_probs",
    f"{ROLLOUT}.free_cache_engine",
    f"{ROLLOUT}.checkpoint_engine.backend",
    "rollout.total_rollout_steps",
    "async_training.require_batches",
    "algorithm.rollout_correction.bypass_mode",
)
"""What a switch to the fully-async trainer adds besides the priced keys (what it asserts, the same workload)."""


def priced_keys() -> frozenset[str]:
    """Every verl key tune may change: the keys the table writes for the searched plan fields, the pools and the
    async schedule. The contract (tests/test_tune_contract.py): any other key of the user's launch is left as is
    (a trainer switch adds :data:`SWITCH_KEYS` too, each listed)."""
    from grpo_tune.frameworks.base.plan import SEARCHED
    from grpo_tune.frameworks.verl import table

    keys = {k.lstrip("+") for r in table.rows("strategy") if r.field in (*SEARCHED, "recompute_layers") for k in r.keys}
    return frozenset(keys | set(POOL_KEYS) | {ST, TRIGGER, PARTIAL})
