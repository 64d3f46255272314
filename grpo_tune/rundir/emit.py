"""Write a chosen plan as a run folder: ``runs/<id>/``.

``best.yaml`` (the RunConfig that ``grpo-tune train`` reads, with the cost model's figures in
``predicted``), ``verl.sh`` and ``megatron_args.txt`` (from :mod:`frameworks.verl.export`), the cluster
launch files (a Slurm script that starts Ray and a KubeRay RayJob, :mod:`frameworks.base.cluster`), and
``report.md`` with its plots. Every file is written atomically. ``search`` and ``refine`` both
emit through :func:`emit`, so a refined winner looks exactly like a searched one plus its
``measured`` figures.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import re
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from grpo_tune.costmodel.estimate import Estimate

from grpo_tune.core.config import RunConfig, TrainerOptions, atomic_write, save
from grpo_tune.core.target import inputs_of


class SearchTables(Protocol):
    """What the report needs from a search: :class:`autotune.search.driver.SearchResult` is one."""

    @property
    def ranked(self) -> Sequence[Estimate]: ...

    @property
    def pareto(self) -> Sequence[Estimate]: ...

    def stats(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Tables:
    """Report tables without a full search result (e.g. refine's own ranked space)."""

    ranked: Sequence[Estimate] = ()
    pareto: Sequence[Estimate] = ()
    counters: dict[str, Any] | None = None

    def stats(self) -> dict[str, Any]:
        return dict(self.counters or {})


SCHEMA_FILES = ("best.yaml", "verl.sh", "megatron_args.txt", "report.md", "step_breakdown.png", "pareto.png")


def run_id(est: Estimate, now: _dt.datetime | None = None) -> str:
    """``<model>-<gpus>g-<hardware>-<YYYYmmdd-HHMMSS>`` (UTC)."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    safe = lambda x: re.sub(r"[^A-Za-z0-9._-]+", "_", x)  # noqa: E731
    return f"{safe(est.model.name)}-{est.cluster.gpus}g-{safe(est.hardware.name)}-{now:%Y%m%d-%H%M%S}"


def predicted(est: Estimate) -> dict[str, Any]:
    """The cost model's figures for ``best.yaml``'s ``predicted`` section (plain YAML types)."""
    return est.predicted()


FROM_SCRATCH_LR = {"tiny": 3e-3, "tiny-vllm": 1e-3}
"""The emitted learning rate for presets that have no pretrained weights and train from a random init
(``tiny`` and ``tiny-vllm``, on CPU). verl's 1e-6 is a fine-tuning rate for a pretrained model: at it tiny's
reward stays flat for hundreds of steps; at 3e-3 it rises within 20 steps on the synthetic task
(tests/test_quickstart.py). ``tiny-vllm`` (hidden 256) collapsed at 3e-3 (entropy near 0 within 20 steps, the
reward flat, with either rollout engine at seed 7 and with vLLM at 1234) and rises at 1e-3
(tests/test_vllm_cpu_train.py, docs/measurements.md)."""


def placement_of(est: Estimate):
    """The Placement an estimate was priced with (colocated unless it carries separate pools' figures)."""
    from grpo_tune.core.placement import Placement

    f = est.placement
    if not f:
        return Placement()
    hw_r = f.get("rollout_hardware")
    return Placement(
        mode="separate",
        rollout_gpus=int(f["rollout_gpus"]),
        rollout_hardware=None if hw_r in (None, est.hardware.name) else hw_r,
        staleness=int(f["staleness"]),
        partial_rollout=bool(f["partial_rollout"]),
        sync_interval=int(f["sync_interval"]),
        recompute_logprobs=bool(f.get("recompute_logprobs", True)),
        stream=bool(f.get("stream_units", 0)),
    )


def run_config(
    est: Estimate,
    *,
    run_dir: Path | None = None,
    measured: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    trainer: TrainerOptions | None = None,
) -> RunConfig:
    if trainer is None and est.model.name in FROM_SCRATCH_LR:
        lr = FROM_SCRATCH_LR[est.model.name]
        trainer = TrainerOptions(lr=lr)
        meta = {**(meta or {}), "lr_note": f"trainer.lr {lr:g}: {est.model.name} trains from a random init"}
    trainer = trainer or TrainerOptions()
    if trainer.rollout_engine == "auto" and est.hardware.memory_is_host and est.strategy.rollout.engine == "vllm":
        # a CPU plan priced with vLLM's CPU build (--rollout-engine vllm): the trainer's auto would pick its own sampler
        trainer = dataclasses.replace(trainer, rollout_engine="vllm")
    if run_dir is not None and trainer.out_dir == TrainerOptions().out_dir:
        trainer = TrainerOptions(**{**trainer.__dict__, "out_dir": str(Path(run_dir) / "train")})
    return RunConfig(
        **inputs_of(est),
        trainer=trainer,
        placement=placement_of(est),
        predicted=predicted(est),
        measured=measured,
        meta=meta,
    )


def emit(
    est: Estimate,
    out_dir: str | os.PathLike,
    *,
    search: SearchTables | None = None,
    measured: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    trainer: TrainerOptions | None = None,
    frameworks: Sequence[str] = ("verl",),
    stage: str | os.PathLike | None = None,
    extra: Mapping[str, tuple[str, int]] | None = None,
) -> dict[str, Path]:
    """Write the run folder for ``est`` into ``out_dir`` (created); return ``{name: path}``.

    ``stage``: write the files into this folder instead, as if they were in ``out_dir`` (every path and name
    inside them says ``out_dir``); :func:`emit_run` renames it into place, so a run folder appears whole.

    The same inputs always write the same folder: nothing is remembered between calls, so refine,
    re-emitting its winner into search's folder, passes the search result it was given.

    Args:
        est: the chosen plan (an exact estimate).
        out_dir: the run folder itself (``runs/<id>``), not its parent.
        search: the search's top plans, Pareto front and counters, for the report (a
            :class:`autotune.search.driver.SearchResult` or :class:`Tables`); None: the report shows ``est`` only.
        measured: figures from profiling runs (refine); go to ``best.yaml`` and the report.
        meta: extra ``meta`` entries for ``best.yaml``.
        trainer: trainer options (default: TrainerOptions with ``out_dir`` inside the run folder).
        frameworks: the launches to write: ``verl`` (verl.sh) and/or ``nemo-rl`` (nemo_rl.yaml), each with its
            cluster launch files (:meth:`~grpo_tune.frameworks.base.Framework.cluster_files`: verl.sbatch and
            verl.rayjob.yaml; nemo_rl.ray_sub.sh and nemo_rl.rayjob.yaml).
        extra: more files of the run folder, ``{name: (text, mode)}`` (tune's tuned.sh), written with the
            others so that they appear with the folder, not after it.
    """
    d = Path(out_dir)
    ranked: Sequence[Estimate] = search.ranked if search is not None else ()
    pareto: Sequence[Estimate] = search.pareto if search is not None else ()
    stats = (search.stats() or None) if search is not None else None
    from grpo_tune import __version__ as version

    meta = {
        "run_id": d.name,
        "emitted_by": f"grpo-tune {version}",
        "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **({"search": stats} if stats else {}),
        **(meta or {}),
    }
    cfg = run_config(est, run_dir=d, measured=measured, meta=meta, trainer=trainer)
    from grpo_tune.frameworks import for_run

    # Rendered before any file is written: a name the exporters refuse (a control character) must not leave
    # a best.yaml without its verl.sh, nor replace half of an earlier run's files.
    launch = [lf for fw in for_run(frameworks) for lf in fw.launch_files(cfg, d)]
    names = [lf.name for lf in launch] + list(extra or {})
    # the cluster launch files (a Slurm script that starts Ray, a KubeRay RayJob) run the folder's launch
    launch += [lf for fw in for_run(frameworks) for lf in fw.cluster_files(cfg, d, names)]
    w = Path(stage) if stage is not None else d  # where the files are written (the content always names d)
    w.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {"best": save(cfg, w / "best.yaml")}
    files = {"run config for `grpo-tune train`": paths["best"]}
    use: list[str] = []
    for lf in launch:
        paths[lf.key] = atomic_write(w / lf.name, lf.text)
        files[lf.label] = paths[lf.key]
        use += lf.use
    for name, (text, _mode) in (extra or {}).items():
        paths[name] = atomic_write(w / name, text)
    from grpo_tune.rundir.report import write_report

    paths.update(
        write_report(
            w,
            est,
            ranked=ranked,
            pareto=pareto,
            stats=stats,
            measured=measured,
            files=files,
            run_id=d.name,
            use=use,
            verl="verl" in frameworks,
        )
    )
    umask = os.umask(0)
    os.umask(umask)
    executable = {lf.key for lf in launch if lf.executable}
    for key, p in paths.items():  # atomic_write's temp files are private (0600); these are for sharing
        os.chmod(p, (0o777 if key in executable else 0o666) & ~umask)
    for name, (_text, mode) in (extra or {}).items():
        os.chmod(paths[name], mode)
    return paths


def emit_run(
    est: Estimate, *, out: str | os.PathLike = "runs", run_name: str | None = None, **kw: Any
) -> tuple[Path, dict[str, Path]]:
    """Create ``out/<run id>/`` (a fresh name; ``-2``, ``-3``... when taken) and :func:`emit` into it.

    The folder appears whole: the files are written into a hidden sibling (``.<id>.*.partial``) and renamed into
    place at the end, so a kill at any moment leaves the complete folder or none (and at most the hidden
    sibling). Two searches that pick the same name: the second rename fails on the first's folder, and the
    second run is emitted again under the next name."""
    import errno
    import shutil
    import tempfile

    base = Path(out)
    name = run_name or run_id(est)
    base.mkdir(parents=True, exist_ok=True)
    umask = os.umask(0)
    os.umask(umask)
    d, k = base / name, 2
    while True:
        while os.path.lexists(d):
            d, k = base / f"{name}-{k}", k + 1
        tmp = Path(tempfile.mkdtemp(prefix=f".{d.name}.", suffix=".partial", dir=base))
        try:
            paths = emit(est, d, stage=tmp, **kw)
            os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's folder is private; a run folder is not
            try:
                os.rename(tmp, d)  # atomic; refused when another search's folder took the name meanwhile
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
                continue
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return d, {key: d / p.name for key, p in paths.items()}


def staging(d: str | os.PathLike) -> Path:
    """A fresh hidden folder inside the existing run folder ``d`` to write its files into before
    :func:`place_files` moves them in (leftovers of a killed writer are removed first)."""
    import shutil
    import tempfile

    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    for old in d.glob(".stage.*.partial"):
        shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=".stage.", suffix=".partial", dir=d))


def place_files(stage: Path, d: Path, paths: Mapping[str, Path]) -> dict[str, Path]:
    """Move each staged file into ``d`` (one ``rename`` each, best.yaml last: until it is replaced the folder's
    best.yaml is the earlier one), then remove the stage. Every file is written before the first is moved, so a kill
    while the files are written (seconds: plots, the report) changes nothing; only the renames (microseconds) can be
    cut."""
    import shutil

    out: dict[str, Path] = {}
    try:
        for key in sorted(paths, key=lambda k: k == "best"):
            dest = d / paths[key].name
            os.replace(paths[key], dest)
            out[key] = dest
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return out


def emit_staged(est: Estimate, d: str | os.PathLike, **kw: Any) -> dict[str, Path]:
    """:func:`emit` into the run folder ``d`` (refine's stable folder), staged: a folder that does not exist yet
    appears whole (written beside it, renamed into place); into an existing one, the files are written in a stage
    inside it and moved in at the end (:func:`place_files`)."""
    import errno
    import shutil
    import tempfile

    d = Path(d)
    if not os.path.lexists(d):
        d.parent.mkdir(parents=True, exist_ok=True)
        umask = os.umask(0)
        os.umask(umask)
        tmp = Path(tempfile.mkdtemp(prefix=f".{d.name}.", suffix=".partial", dir=d.parent))
        try:
            paths = emit(est, d, stage=tmp, **kw)
            os.chmod(tmp, 0o777 & ~umask)
            os.rename(tmp, d)
            return {key: d / p.name for key, p in paths.items()}
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    stage = staging(d)
    try:
        paths = emit(est, d, stage=stage, **kw)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return place_files(stage, d, paths)
