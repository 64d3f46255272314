"""Reading a verl launch (a bash script or a Hydra override list) into its overrides, for ``tune``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from grpo_tune.frameworks.verl import diagnose as D
from grpo_tune.frameworks.verl import snapshot as verl
from grpo_tune.frameworks.verl.table import ACTOR, ARO, REF, ROLLOUT
from grpo_tune.core.errors import ConfigError

# verl's key prefixes and our degree -> Megatron key map live with the Strategy<->verl table and diagnose.
DEGREE_KEYS = D.rules.DEGREES


def inherited_from(key: str) -> str | None:
    """The actor key that ``key`` takes its value from when the launch does not set it, else None: the
    reference inherits the actor's degrees and param_offload (verl 0.9.1 ``ref/ref.yaml``, ``oc.select``)."""
    leaf = key.rsplit(".", 1)[-1]
    if key.startswith(f"{REF}.megatron.") and leaf in (*DEGREE_KEYS.values(), "param_offload"):
        return f"{ACTOR}.megatron.{leaf}"
    return None


@dataclass
class Launch:
    path: Path
    text: str
    kind: str
    """``verl_script`` or ``overrides``."""
    overrides: list[D.Override]
    values: dict[str, D.Override] = field(default_factory=dict)
    key_findings: list[D.Finding] = field(default_factory=list)
    """diagnose's key check of the launch (unknown keys, keys Hydra refuses): tune reports them first."""
    renames: dict[str, str] = field(default_factory=dict)
    """Blog-only key -> the real key whose value it gives (read into ``values``; rewritten in tuned.sh)."""
    config_name: str | None = None
    """``--config-name`` of the launch (``fully_async_ppo_megatron_trainer`` or ``one_step_off_ppo_megatron_trainer``:
    separate pools)."""

    @property
    def separate(self) -> bool:
        """verl's fully-async or one-step-off trainer: separate rollout and training pools."""
        from grpo_tune.frameworks.verl.pool_trainers import trainer_of

        return trainer_of(self.config_name) is not None

    @property
    def one_step(self) -> bool:
        from grpo_tune.frameworks.verl import one_step_off

        return self.config_name == one_step_off.CONFIG_NAME

    def refused(self) -> list[D.Finding]:
        """The key findings verl's Hydra would refuse the launch for (errors)."""
        return [f for f in self.key_findings if f.severity == "error"]

    def get(self, key: str) -> object:
        ov = self.values.get(key)
        if ov is not None:
            return ov.value
        src = inherited_from(key)
        if src is not None:
            return self.get(src)
        from grpo_tune.frameworks.verl.pool_trainers import trainer_of

        t = trainer_of(self.config_name)
        return t.default(key) if t is not None else verl.default(key)


def read_launch(path: str | Path) -> Launch:
    """Parse a verl launch script or override list; a launch we cannot read is a coded error."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"no launch file at {p}", hint="pass a verl launch script (bash) or a file of Hydra overrides"
        )
    from grpo_tune.frameworks.base.inputs import read_text

    # the bytes as bash reads them: no newline translation (a CRLF script is refused as diagnose refuses it, and an
    # override list's CRLF line endings are kept in tuned.sh)
    text = read_text(p, limit=4 * 1024 * 1024, what="verl launch script or override list")
    config_name = None
    if re.search(r"main_ppo|fully_async_main|verl-train|^#!", text, re.MULTILINE):
        _bash_syntax(p)
        ovs, findings, facts = D.parse_script(text)
        config_name = facts.get("config_name")
        kind = "verl_script"
        if not facts.get("commands"):
            raise ConfigError(
                f"{p}: no `python3 -m verl.trainer.main_ppo` command in this script",
                hint="tune reads the overrides passed to verl's main_ppo",
            )
    else:
        ovs, findings = D.parse_override_list(text)
        kind = "overrides"
    errors = [f for f in findings if f.severity == "error" and f.code == "BAD_CONFIG"]
    if errors:
        raise ConfigError(
            f"{p}: {errors[0].message}",
            hint=errors[0].hint or "fix the launch; `grpo-tune diagnose` lists every problem",
        )
    if not ovs:
        raise ConfigError(
            f"{p}: no key=value overrides found",
            hint="pass a verl launch script or a file with one Hydra override per line",
        )
    unresolved = [
        o
        for o in ovs
        if o.unresolved
        and not o.key.startswith(("data.train_files", "data.val_files"))
        and o.key != f"{ARO}.model.path"
    ]
    # one reader with diagnose: its key check, and blog-only keys read as their real twins
    mapped, renames = D.apply_renames(ovs)
    launch = Launch(
        path=p,
        text=text,
        kind=kind,
        overrides=ovs,
        values={o.key: o for o in mapped},
        key_findings=D.key_findings(ovs, config_name=config_name),
        renames=renames,
        config_name=config_name,
    )
    for o in unresolved:
        if o.key in _planned_keys(launch):
            raise ConfigError(
                f"{p}:{o.line}: {o.key}={o.raw} comes from a variable the script does not set",
                hint="give the variable a default (${VAR:-2}) so that the plan is known",
            )
    return launch


def _bash_syntax(p: Path) -> None:
    """``bash -n``: a script bash itself cannot parse (an unclosed quote, a dangling ``\\``) is not a launch."""
    import shutil
    import subprocess

    bash = shutil.which("bash")
    if bash is None:
        return
    try:
        r = subprocess.run([bash, "-n", str(p)], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return
    if r.returncode:
        msg = (r.stderr.strip().splitlines() or ["syntax error"])[-1]
        raise ConfigError(f"{p}: bash cannot parse this script ({msg})", hint="fix the script; `bash -n` must pass")


def _planned_keys(launch: Launch) -> set[str]:
    keys = {f"{r}.megatron.{k}" for r in (ACTOR, REF) for k in (*DEGREE_KEYS.values(), "param_offload")}
    keys |= {
        "data.train_batch_size",
        "data.max_prompt_length",
        "data.max_response_length",
        f"{ROLLOUT}.n",
        f"{ACTOR}.ppo_mini_batch_size",
        f"{ACTOR}.ppo_micro_batch_size_per_gpu",
        f"{ROLLOUT}.tensor_model_parallel_size",
        f"{ROLLOUT}.gpu_memory_utilization",
        "trainer.n_gpus_per_node",
        "trainer.nnodes",
    }
    return keys
