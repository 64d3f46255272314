"""The configs of verl 0.9.1's separate-pool trainers (``verl/experimental/*/config``), composed for real.

Each experimental trainer ships a Hydra config that builds on ``ppo_megatron_trainer`` (its ``defaults``) and adds
or changes a few keys. :class:`WheelConfig` unpacks one from the verl wheel next to the trainer config, composes it
as its entry point does (the trainer config on Hydra's search path), and reads the shipped snapshot of the keys it
adds or changes (``frameworks/verl/data/verl-0.9.1-*-keys.json``, rebuilt by ``python -m <module>
--write-snapshot``): the fully-async trainer (frameworks/verl/fully_async.py, what grpo-tune emits) and the
one-step-off trainer (frameworks/verl/one_step_off.py, read back by diagnose and tune).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, cast

from grpo_tune.frameworks.verl import snapshot as verl
from grpo_tune.core.errors import ConfigError, MissingDependencyError, try_import


@dataclass(frozen=True)
class WheelConfig:
    """One experimental trainer's config in the verl wheel."""

    entry: str
    """``python3 -m`` module of the trainer."""
    name: str
    """``--config-name`` of its Megatron config."""
    subdir: str
    """The config folder inside the wheel."""
    module: str
    """The grpo-tune module that maintains its snapshot (``python -m <module> --write-snapshot``)."""
    what: str
    """The trainer in words (``fully-async``, ``one-step-off``)."""
    _cache: dict[str, dict[str, object]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def snapshot_path(self) -> Path:
        return verl.DATA_DIR / f"verl-{verl.VERL_VERSION}-{self.what}-keys.json"

    def config_dir(self, *, fetch: bool = True) -> Path:
        """The config folder of the verl wheel, unzipped next to the trainer config on first use."""
        target = verl.cache_dir() / self.subdir
        if (target / f"{self.name}.yaml").is_file():
            return target
        if not fetch:
            raise MissingDependencyError(
                f"verl {verl.VERL_VERSION}'s {self.what} config is not cached in {verl.cache_dir()}",
                hint=f"run `python -m {self.module} --fetch` (needs PyPI)",
            )
        verl.config_dir(fetch=True)  # the trainer config it builds on
        with tempfile.TemporaryDirectory(dir=verl.cache_root(), prefix=".verl-async-") as tmp:
            wheel = verl._download_wheel(Path(tmp))
            stage = Path(tmp) / "tree"
            with zipfile.ZipFile(wheel) as zf:
                members = [n for n in zf.namelist() if n.startswith(self.subdir + "/")]
                if not members:
                    raise ConfigError(f"{wheel.name} has no {self.subdir}/")
                zf.extractall(stage, members)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                (stage / self.subdir).rename(target)
            except OSError:
                if not (target / f"{self.name}.yaml").is_file():
                    shutil.rmtree(target, ignore_errors=True)
                    (stage / self.subdir).rename(target)
        return target

    def compose(self, overrides: Iterable[str] = (), *, fetch: bool = True, resolve: bool = True) -> dict[str, object]:
        """Compose the config as its entry point does (its search path points at the trainer config); a key Hydra
        rejects raises UNKNOWN_KEY."""
        try_import("hydra", "test")
        from hydra import compose as hydra_compose
        from hydra import initialize_config_dir
        from hydra.errors import HydraException
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        adir = self.config_dir(fetch=fetch)
        tdir = verl.config_dir(fetch=fetch)
        ovs = [*overrides, f"hydra.searchpath=[file://{tdir}]"]
        try:
            with initialize_config_dir(config_dir=str(adir), version_base=None):
                cfg = hydra_compose(self.name, overrides=ovs)
            return cast(dict[str, object], OmegaConf.to_container(cfg, resolve=resolve))
        except (HydraException, OmegaConfBaseException) as exc:
            raise verl.rejected(exc, f"verl {verl.VERL_VERSION} ({self.name})") from None

    def snapshot(self) -> dict[str, object]:
        """The keys the config adds to or changes in ``ppo_megatron_trainer``: dotted key -> default."""
        if "keys" not in self._cache:
            try:
                self._cache["keys"] = json.loads(self.snapshot_path.read_text())["keys"]
            except (OSError, ValueError) as exc:  # pragma: no cover - a broken install
                raise ConfigError(f"cannot read {self.snapshot_path}: {exc}", hint="reinstall grpo-tune") from None
        return self._cache["keys"]

    def default(self, key: str, fallback: object = None) -> object:
        snap = self.snapshot()
        return snap[key] if key in snap else verl.default(key, fallback)

    def declared(self, key: str) -> bool:
        return key in self.snapshot() or key in verl.snapshot()

    def write_snapshot(self, path: Path | None = None) -> Path:
        path = path or self.snapshot_path
        base = verl.flatten(verl.compose([], fetch=True))
        tree = verl.flatten(self.compose([], fetch=True))
        delta = {k: v for k, v in tree.items() if k not in base or base[k] != v}
        data = {
            "source": f"verl=={verl.VERL_VERSION} wheel (PyPI), {self.subdir}/{self.name}.yaml composed with "
            "hydra-core (search path: verl/trainer/config), OmegaConf-resolved; the keys it adds to or changes in "
            f"ppo_megatron_trainer; written by `python -m {self.module} --write-snapshot`",
            "verl_version": verl.VERL_VERSION,
            "keys": delta,
        }
        path.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
        return path
