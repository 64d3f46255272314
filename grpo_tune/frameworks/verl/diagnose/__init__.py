"""``diagnose``: coded findings for a grpo-tune run config, a verl launch script or a Hydra override list.

Every input becomes a set of verl 0.9.1 overrides (a run config through :func:`export.verl_overrides`),
which the registered rules (:mod:`.rules`, in order: keys, algorithm, cluster, degrees, batches, dtypes,
optimizer, memory) check against verl's real key tree (the shipped snapshot, see :mod:`frameworks.verl.snapshot`),
verl's and Megatron's own divisibility rules, and the cost model's memory estimate when the model maps
to a preset or a local config.json.

Parts: :mod:`.parse` (launch scripts and override lists, bounded) and :mod:`.shell` (bash words), :mod:`.rules`
(the registry) and :mod:`.rules_plan` (degrees, batches, memory); what every framework's checker shares (the
findings, bounded inputs, the model lookup) is in :mod:`grpo_tune.frameworks.base`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from grpo_tune.core import bounds as _bounds
from grpo_tune.core.errors import ConfigError, GrpoTuneError, InvalidDegreesError
from grpo_tune.core.specs import HardwareSpec, ModelSpec, load_hardware, load_model

from grpo_tune.frameworks.verl.diagnose.context import Ctx
from grpo_tune.frameworks.base.findings import SEVERITIES, Finding, Report, Severity, Summary
from grpo_tune.frameworks.base import models
from grpo_tune.frameworks.base.inputs import Override, load_yaml, override, parse_value, read_text
from grpo_tune.frameworks.verl.diagnose.parse import from_mapping, parse_override_list, parse_script
from grpo_tune.frameworks.verl.diagnose.rules import RULES, apply_renames, register, rename_of, run_rules
from grpo_tune.frameworks.verl.table import ARO

__all__ = [
    "Finding",
    "Override",
    "Report",
    "RULES",
    "SEVERITIES",
    "Severity",
    "apply_renames",
    "key_findings",
    "rename_of",
    "diagnose_config",
    "diagnose_overrides",
    "diagnose_path",
    "parse_override_list",
    "parse_script",
    "parse_value",
    "register",
    "resolve_model",
]


def resolve_model(path: object) -> tuple[ModelSpec | None, str]:
    """Map verl's model path (``{ARO}.model.path``) to a preset or a local config.json."""
    return models.resolve_model(path, key=f"{ARO}.model.path")


def diagnose_overrides(
    overrides: list[Override] | list[str],
    *,
    hardware: str | HardwareSpec | None = None,
    model: str | ModelSpec | None = None,
    source: str = "<overrides>",
    kind: str = "overrides",
    findings: list[Finding] | None = None,
    config_name: str | None = None,
    rollout_hardware: HardwareSpec | None = None,
) -> Report:
    """Check a list of verl overrides (strings ``key=value`` or parsed :class:`Override`); ``rollout_hardware``:
    the rollout pool's profile of a separate plan, where it is not ``hardware``."""
    findings = list(findings or [])
    items: list[Override] = []
    for o in overrides:
        if isinstance(o, Override):
            items.append(o)
            continue
        ov = override(str(o).strip())
        if ov is None:
            findings.append(Finding(Severity.WARNING, "BAD_CONFIG", f"{o!r} is not a key=value override"))
        elif ov.prefix != "~":
            items.append(ov)
    report = Report(source=source, kind=kind, findings=findings)
    items, _ = apply_renames(items)  # blog-only keys are read as their real twins (and still reported)
    c = Ctx.of(items, report.findings, config_name=config_name)
    if isinstance(model, ModelSpec):
        c.model, c.model_note = model, f"preset {model.name}"
    elif model:
        c.model, c.model_note = load_model(model), f"--model {model}"
    else:
        path = c.raw(f"{ARO}.model.path") if c.known(f"{ARO}.model.path") else None
        c.model, c.model_note = resolve_model(path)
    c.hardware = hardware if isinstance(hardware, HardwareSpec) else load_hardware(hardware or "h100")
    c.rollout_hardware = rollout_hardware
    run_rules(c)
    report.summary = _summary(c)
    return report


def key_findings(overrides: list[Override], *, config_name: str | None = None) -> list[Finding]:
    """diagnose's key check (unknown keys with their did-you-mean, keys Hydra refuses without or with ``+``) and
    the settings it does not price (LoRA, a rollout engine other than vLLM): what ``tune`` reports before it prices
    a launch."""
    found: list[Finding] = []
    run_rules(Ctx.of(list(overrides), found, config_name=config_name), ("keys", "not_priced"))
    return found


def _replicas(c: Ctx, rtp: int | None) -> int | None:
    """vLLM replicas: over the rollout pool with separate pools, over the whole world colocated."""
    gpus = c.placement["rollout_gpus"] if c.placement else c.world
    return gpus // rtp if gpus and rtp and gpus % rtp == 0 else None


def _summary(c: Ctx) -> Summary:
    a, r = c.roles["actor"], c.roles["rollout"]
    rtp, world = r["tp"], c.world
    return {
        "model": c.model.name if c.model else None,
        "model_note": c.model_note,
        "hardware": c.hardware.name if c.hardware else None,
        **({"rollout_hardware": c.rollout_hardware.name} if c.rollout_hardware else {}),
        "world_size": world,
        "nnodes": c.nnodes,
        "gpus_per_node": c.gpn,
        "dp": c.dp,
        "roles": {
            "actor": {**a, "dp": c.dp},
            "ref": {**c.roles["ref"], "dp": c.dp},
            "rollout": {
                "tp": rtp,
                "pp": r["pp"],
                "replicas": _replicas(c, rtp),
                "gpu_memory_utilization": r["gpu_memory_utilization"],
                "name": r["name"],
            },
        },
        "batch": c.batches,
        "memory": c.memory,
        **({"placement": c.placement} if c.placement else {}),
    }


def diagnose_config(cfg, *, source: str = "<run config>", hardware: str | None = None) -> Report:
    """A grpo-tune run config: checked as the verl launch it exports to, with its own model and hardware."""
    from grpo_tune.frameworks.verl import fully_async
    from grpo_tune.frameworks.verl.export import verl_overrides

    files = {
        "model_path": cfg.model.hf_id or cfg.model.name,
        "train_files": "train.parquet",
        "val_files": "test.parquet",
    }
    if cfg.placement.separate:  # the fully-async launch that search emits for it (frameworks/verl/fully_async.py)
        p = cfg.placement
        return diagnose_overrides(
            fully_async.overrides(cfg, **files),
            hardware=hardware or cfg.hardware,
            model=cfg.model,
            source=source,
            kind="run_config",
            config_name=fully_async.CONFIG_NAME,
            rollout_hardware=None if hardware else p.rollout_profile(),
        )
    ovs = verl_overrides(cfg, **files)
    return diagnose_overrides(ovs, hardware=hardware or cfg.hardware, model=cfg.model, source=source, kind="run_config")


def looks_like_script(text: str) -> bool:
    """A verl launch script (it starts verl's trainer, or is a shell script), not a plain override list."""
    return re.search(r"main_ppo|fully_async_main|verl-train|diagnose\.py|^#!", text, re.M) is not None


def diagnose_path(
    path: str | os.PathLike,
    *,
    hardware: str | None = None,
    model: str | None = None,
    overrides: list[str] | None = None,
) -> Report:
    """Read a run config (YAML with ``schema_version``), a verl YAML config, a launch script or an override list,
    and diagnose it. Unreadable input raises a coded error; reading is bounded. Other frameworks' files (a
    NeMo-RL recipe with Hydra-style ``overrides``) go through :func:`grpo_tune.frameworks.diagnose_path`."""
    p = Path(path)
    text = read_text(p, what="launch script, override list or config")
    if not text.strip():
        raise ConfigError(f"{p} is empty", hint="pass a best.yaml, a verl launch script or an override list")
    if p.suffix in (".yaml", ".yml", ".json"):
        return _yaml(p, text, hardware, model, list(overrides or []))
    if overrides:
        raise ConfigError(
            f"{p}: extra overrides apply to a NeMo-RL recipe only",
            hint="put the overrides into the verl launch itself",
        )
    if looks_like_script(text):
        ovs, fnd, facts = parse_script(text)
        _bounds.check_keys(((o.key, o.value) for o in ovs), where=str(p))
        return diagnose_overrides(
            ovs,
            hardware=hardware,
            model=model,
            source=str(p),
            kind="verl_script",
            findings=fnd,
            config_name=facts["config_name"],
        )
    ovs, fnd = parse_override_list(text)
    _bounds.check_keys(((o.key, o.value) for o in ovs), where=str(p))
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    plain = [ln for ln in lines if all("=" in w for w in ln.replace("\\", " ").split())]
    if not ovs or len(plain) * 2 < len(lines):  # prose with a few `a=b` in it (a README) is not an override list
        raise ConfigError(
            f"{p} is not a launch: neither a script that starts verl nor a list of key=value overrides "
            f"({len(plain)} of its {len(lines)} lines are overrides)",
            hint="pass a best.yaml, a verl launch script or a file with one override per line",
        )
    return diagnose_overrides(ovs, hardware=hardware, model=model, source=str(p), findings=fnd)


def _yaml(p: Path, text: str, hardware: str | None, model: str | None, overrides: list[str] | None = None) -> Report:
    data, dups = load_yaml(text, str(p))
    found = [
        Finding(
            Severity.WARNING,
            "BAD_CONFIG",
            f"line {line}: key {k!r} appears twice in its mapping; YAML keeps the last one silently",
            "remove one of them",
            line=line,
        )
        for k, line in dups
    ]
    if isinstance(data, dict) and ("schema_version" in data or "strategy" in data):
        rep = _run_config(p, data, hardware)
        rep.findings[:0] = found
        return rep
    if overrides:
        raise ConfigError(
            f"{p}: extra overrides apply to a NeMo-RL recipe only",
            hint="append key=value overrides to a verl launch inside the script, or pass a NeMo-RL recipe",
        )
    if isinstance(data, dict) and "model_type" in data and "hidden_size" in data:
        raise ConfigError(
            f"{p} is a Hugging Face model config, not a launch",
            hint=f"pass the launch script, and --model {p} if its model path maps to no preset",
        )
    if isinstance(data, dict):
        return diagnose_overrides(
            from_mapping(data), hardware=hardware, model=model, source=str(p), kind="verl_yaml", findings=found
        )
    if isinstance(data, list) and all(isinstance(x, str) for x in data):
        ovs, fnd = parse_override_list("\n".join(data))
        return diagnose_overrides(ovs, hardware=hardware, model=model, source=str(p), findings=found + fnd)
    raise ConfigError(
        f"{p}: neither a run config, a verl config nor an override list",
        hint="pass a best.yaml, a verl YAML config, or a YAML list of key=value strings",
    )


def _run_config(p: Path, data: dict, hardware: str | None) -> Report:
    from grpo_tune.core.config import RunConfig

    try:
        cfg = RunConfig.from_dict(data, where=str(p))
    except InvalidDegreesError as exc:
        # The file is readable but its degrees cannot exist: that is a finding, not a crash.
        rep = Report(
            source=str(p),
            kind="run_config",
            findings=[Finding(Severity.ERROR, "INVALID_DEGREES", exc.message, exc.hint)],
        )
        rep.summary = {"strategy": data.get("strategy"), "cluster": data.get("cluster")}
        return rep
    except GrpoTuneError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:
        raise ConfigError(f"{p}: {exc}", hint="check the run config against `grpo-tune search` output") from None
    return diagnose_config(cfg, source=str(p), hardware=hardware)
