"""verl 0.9.1's real Hydra config: fetch it, compose it, and look keys up in it.

verl is not a dependency. Its trainer config is plain YAML under ``verl/trainer/config/`` in the
wheel, so we fetch the wheel with ``pip download --no-deps verl==0.9.1`` into a cache folder
(``$GRPO_TUNE_CACHE`` or ``~/.cache/grpo-tune``), unzip only that folder, and compose it with
hydra-core's compose API (``initialize_config_dir`` + ``compose("ppo_megatron_trainer")``).
Nothing in verl's Python runtime is imported: 0.9.1's YAML only uses OmegaConf's built-in
``oc.select`` resolver, and ``_target_`` fields are plain strings until verl instantiates them.

``diagnose`` needs the key tree without a network or hydra-core, so a flattened snapshot of the
composed tree (dotted key -> resolved default) ships as ``frameworks/verl/data/verl-0.9.1-keys.json``;
``python -m grpo_tune.frameworks.verl.snapshot --write-snapshot`` rebuilds it and tests/test_verl_compose.py checks that
it still equals what the real wheel composes to.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, cast

from grpo_tune.core.errors import ConfigError, GrpoTuneError, MissingDependencyError, UnknownKeyError, try_import

VERL_VERSION = "0.9.1"
CONFIG_NAME = "ppo_megatron_trainer"
CONFIG_SUBDIR = "verl/trainer/config"
DATA_DIR = Path(__file__).resolve().parent / "data"
SNAPSHOT = DATA_DIR / f"verl-{VERL_VERSION}-keys.json"

# Keys under these prefixes are free-form mappings in verl: anything is accepted with `+key=...`
# and forwarded to another library (Megatron's TransformerConfig, vLLM engine kwargs, ...).
OPEN_PREFIXES = (
    "actor_rollout_ref.actor.megatron.override_transformer_config",
    "actor_rollout_ref.ref.megatron.override_transformer_config",
    "critic.megatron.override_transformer_config",
    "actor_rollout_ref.actor.megatron.override_ddp_config",
    "actor_rollout_ref.actor.megatron.override_mcore_model_config",
    "actor_rollout_ref.model.override_config",
    "actor_rollout_ref.rollout.engine_kwargs",
    "actor_rollout_ref.actor.optim.override_optimizer_config",
)


def cache_root() -> Path:
    return Path(os.environ.get("GRPO_TUNE_CACHE") or Path.home() / ".cache" / "grpo-tune")


def cache_dir() -> Path:
    return cache_root() / f"verl-{VERL_VERSION}"


def _download_wheel(dest: Path) -> Path:
    """``pip download --no-deps verl==VERSION``; a local wheel in $GRPO_TUNE_VERL_WHEEL skips the network."""
    local = os.environ.get("GRPO_TUNE_VERL_WHEEL")
    if local:
        if not Path(local).is_file():
            raise ConfigError(f"GRPO_TUNE_VERL_WHEEL={local} is not a file")
        return Path(local)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "-q",
        f"verl=={VERL_VERSION}",
        "-d",
        str(dest),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MissingDependencyError(f"could not run pip to fetch verl {VERL_VERSION}: {exc}") from None
    wheels = sorted(dest.glob(f"verl-{VERL_VERSION}-*.whl"))
    if proc.returncode or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel"]
        raise MissingDependencyError(
            f"pip download verl=={VERL_VERSION} failed: {tail[0]}",
            hint="check network access to PyPI, or point GRPO_TUNE_VERL_WHEEL at a wheel",
        )
    return wheels[0]


def config_dir(*, fetch: bool = True) -> Path:
    """The folder holding verl's trainer YAML, fetched and unzipped on first use."""
    target = cache_dir() / CONFIG_SUBDIR
    if (target / f"{CONFIG_NAME}.yaml").is_file():
        return target
    if not fetch:
        raise MissingDependencyError(
            f"verl {VERL_VERSION}'s config is not cached in {cache_dir()}",
            hint="run `python -m grpo_tune.frameworks.verl.snapshot --fetch` (needs PyPI)",
        )
    cache_root().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_root(), prefix=".verl-") as tmp:
        wheel = _download_wheel(Path(tmp))
        stage = Path(tmp) / "tree"
        with zipfile.ZipFile(wheel) as zf:
            members = [n for n in zf.namelist() if n.startswith(CONFIG_SUBDIR + "/")]
            if not members:
                raise ConfigError(f"{wheel.name} has no {CONFIG_SUBDIR}/")
            zf.extractall(stage, members)
        # rename into place so that a concurrent reader never sees half a tree
        dest = cache_dir()
        try:
            stage.rename(dest)
        except OSError:
            if not (target / f"{CONFIG_NAME}.yaml").is_file():
                shutil.rmtree(dest, ignore_errors=True)
                stage.rename(dest)
    return target


def compose(overrides: Iterable[str] = (), *, fetch: bool = True, resolve: bool = True) -> dict[str, object]:
    """Compose ``ppo_megatron_trainer`` with Hydra overrides, as ``main_ppo`` would; returns a plain dict.

    A key Hydra rejects (not in the schema and without ``+``) raises UNKNOWN_KEY.
    """
    try_import("hydra", "test")
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    cdir = config_dir(fetch=fetch)
    overrides = list(overrides)
    try:
        with initialize_config_dir(config_dir=str(cdir), version_base=None):
            cfg = hydra_compose(CONFIG_NAME, overrides=overrides)
        # to_container is typed for any node; a composed Hydra config's root is a mapping with str keys.
        return cast(dict[str, object], OmegaConf.to_container(cfg, resolve=resolve))
    except (HydraException, OmegaConfBaseException) as exc:
        raise rejected(exc, f"verl {VERL_VERSION}") from None


def rejected(exc: Exception, who: str) -> ConfigError:
    """Hydra's refusal of a list of overrides as a coded error: UNKNOWN_KEY for a key the config does not have."""
    msg = str(exc).splitlines()[0]
    code = UnknownKeyError if "Could not override" in msg or "Key '" in msg else ConfigError
    return code(f"{who} rejects the overrides: {msg}", hint="prefix an undeclared key with `+`, or fix its name")


def flatten(tree: object, prefix: str = "") -> dict[str, object]:
    """Dotted key -> leaf value. Empty mappings stay as leaves (``{}``) so open sections are kept."""
    out: dict[str, object] = {}
    if isinstance(tree, dict) and tree:
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    else:
        out[prefix] = tree
    return out


@lru_cache(maxsize=1)
def snapshot() -> dict[str, object]:
    """verl 0.9.1's composed ``ppo_megatron_trainer`` as dotted key -> resolved default (shipped data)."""
    try:
        data = json.loads(SNAPSHOT.read_text())
    except (OSError, ValueError) as exc:  # pragma: no cover - a broken install
        raise ConfigError(f"cannot read {SNAPSHOT}: {exc}", hint="reinstall grpo-tune") from None
    keys: dict[str, object] = data["keys"]
    return keys


def key_status(key: str) -> str:
    """``declared`` (in verl's schema), ``open`` (under a free-form section), ``parent`` (a section
    name, not a leaf) or ``unknown``."""
    if key in snapshot():
        return "declared"
    if any(key == p or key.startswith(p + ".") for p in OPEN_PREFIXES):
        return "open"
    if key in _parents():
        return "parent"
    return "unknown"


@lru_cache(maxsize=1)
def _parents() -> frozenset[str]:
    """Every section name of the key tree (``a`` and ``a.b`` for ``a.b.c``): one set look-up per key."""
    return frozenset(k.rsplit(".", i)[0] for k in snapshot() for i in range(1, k.count(".") + 1))


def default(key: str, fallback: object = None) -> object:
    return snapshot().get(key, fallback)


@lru_cache(maxsize=1)
def leaf_names() -> dict[str, list[str]]:
    """Last key component -> full keys (for 'did you mean' on a bare or misplaced name)."""
    out: dict[str, list[str]] = {}
    for k in snapshot():
        out.setdefault(k.rsplit(".", 1)[-1], []).append(k)
    return out


def write_snapshot(path: Path = SNAPSHOT) -> Path:
    keys = flatten(compose([], fetch=True))
    data = {
        "source": f"verl=={VERL_VERSION} wheel (PyPI), {CONFIG_SUBDIR}/{CONFIG_NAME}.yaml composed with "
        "hydra-core, OmegaConf-resolved; written by `python -m grpo_tune.frameworks.verl.snapshot --write-snapshot`",
        "verl_version": VERL_VERSION,
        "keys": keys,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    return path


def maintain(argv: list[str] | None, fetch: Callable[..., Path], write: Callable[[], Path]) -> int:
    """The maintainers' command of a snapshot module: ``--fetch`` prints the unpacked wheel's config folder,
    ``--write-snapshot`` rewrites the shipped snapshot; a coded error prints ``[CODE]`` + hint and returns 2."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if "--fetch" in argv:
            print(fetch(fetch=True))
        if "--write-snapshot" in argv:
            print(write())
    except GrpoTuneError as exc:
        print(f"[{exc.code}] {exc.message}\nhint: {exc.hint}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    return maintain(argv, config_dir, write_snapshot)


if __name__ == "__main__":
    sys.exit(main())
