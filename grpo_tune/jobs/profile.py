"""``grpo-tune profile``'s work: measure a run config with a short real run (the trainer under torchrun on a
synthetic workload with the config's lengths) and write the profile JSON (``core/profile_report.py``).

:func:`run_profile` takes a :class:`ProfileRequest` and returns a :class:`ProfileOutcome`; ``cli/profile.py``
prints it. When the workers die without writing the JSON, the job writes it from their failure records. The
workers' process group is stopped on every way out (``trainer.launch.run_workers``), after ``--timeout`` too.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from grpo_tune.core.safeio import read_text
from grpo_tune.jobs.train import Nodes


@dataclass(frozen=True)
class ProfileRequest:
    """What ``profile`` was asked: the config, the steps, where the JSON and the scratch folder go."""

    config: Path
    steps: int = 3
    json_path: Path = Path("profile.json")
    out: Path | None = None
    """The scratch folder for logs and metrics (None: ``<json stem>.run`` next to the JSON)."""
    nodes: Nodes = Nodes()
    timeout: float | None = None
    """Stop the workers after this many seconds (None: no limit)."""


@dataclass(frozen=True)
class ProfileStart:
    """A profiling run about to start (the lock held, the previous run's figures cleared)."""

    model: str
    world_size: int
    steps: int
    out_dir: Path

    @property
    def log(self) -> Path:
        return self.out_dir / "train.log"


@dataclass(frozen=True)
class ProfileOutcome:
    """How the profiling run ended, and its figures when it succeeded on node 0."""

    status: str
    message: str | None
    exit_code: int
    node_rank: int
    json_path: Path
    log_tail: str | None = None
    """A failed run's log tail (node 0)."""
    report: dict[str, object] | None = None
    """The profile JSON as written (node 0, a run that succeeded)."""


def run_profile(
    req: ProfileRequest,
    *,
    say: Callable[[str], None] | None = None,
    started: Callable[[ProfileStart], None] | None = None,
) -> ProfileOutcome:
    """Check everything before a process starts (``--json`` never over the config), run the workers under the
    scratch folder's lock, and return how they ended. ``say`` is told the run lock's messages, ``started`` the
    run just before the workers start. Node 0 writes the JSON; a failed run's JSON is written here."""
    from grpo_tune.core.errors import ConfigError
    from grpo_tune.core.runlock import acquire, lock_name
    from grpo_tune.jobs.train import check_rendezvous, load_checked
    from grpo_tune.rundir.outputs import check_output
    from grpo_tune.trainer import launch
    from grpo_tune.trainer import profile as tprofile

    config, steps, json_path, timeout = req.config, req.steps, req.json_path, req.timeout
    node_rank = req.nodes.node_rank
    check_output(json_path, "--json", inputs={"CONFIG": config})  # before anything runs: never over the config itself
    check_rendezvous(req.nodes.master_addr, req.nodes.master_port)
    out = req.out if req.out is not None else json_path.parent / f"{json_path.stem}.run"
    cfg, lay, out_dir = load_checked(
        config, steps=steps, out=out, nnodes=req.nodes.nnodes, node_rank=node_rank, resume=False, scratch=True
    )
    if timeout is not None and not (timeout > 0 and timeout < float("inf")):
        raise ConfigError(f"--timeout must be a finite number of seconds > 0, got {timeout}")
    cmd = launch.torchrun_command(
        config,
        lay,
        node_rank=node_rank,
        master_addr=req.nodes.master_addr,
        master_port=req.nodes.master_port,
        worker_args=[
            "--steps",
            str(steps),
            "--out",
            str(out_dir),
            "--no-resume",
            "--profile-json",
            str(json_path.resolve()),
        ],
    )
    with acquire(out_dir, "grpo-tune profile", say=say, name=lock_name(node_rank)) as lk:
        if node_rank == 0:  # node 0 holds global rank 0, which writes the JSON; the others leave it alone
            json_path.unlink(missing_ok=True)  # never report a previous run's figures
            launch.trim_metrics(out_dir, None)  # a scratch folder: this run's steps only
        launch.clear_failures(out_dir)
        if started is not None:
            started(ProfileStart(model=cfg.model.name, world_size=lay.world_size, steps=steps, out_dir=out_dir))
        rc = launch.run_workers(cmd, out_dir, deadline_s=timeout, pass_fds=(lk.fd,))
    message: str | None
    status, message, code = launch.worker_status(rc, out_dir)
    if rc == 124 and timeout is not None:
        status, message, code = "error", f"timed out: stopped after --timeout {timeout:g} s", launch.EXIT_ERROR
    end = ProfileOutcome(status=status, message=message, exit_code=code, node_rank=node_rank, json_path=json_path)
    if node_rank > 0:
        return end
    if code == launch.EXIT_OK and not json_path.exists():
        status, message, code = (
            "error",
            "the workers exited cleanly without writing the profile JSON",
            launch.EXIT_ERROR,
        )
    end = dataclasses.replace(end, status=status, message=message, exit_code=code)
    if code != launch.EXIT_OK:
        tprofile.write(
            json_path,
            tprofile.result(status, message=message, config=str(config), steps=steps, world_size=lay.world_size),
        )
        return dataclasses.replace(end, log_tail=launch.log_tail(out_dir, 15))
    return dataclasses.replace(end, report=json.loads(read_text(json_path)))
