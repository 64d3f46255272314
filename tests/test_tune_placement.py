"""tune on a colocated verl launch proposes separate pools when the user allows staleness and the split wins."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from grpo_tune.cli.main import main

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "qwen3-30b-a3b-grpo-megatron.sh"


def _run(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = main(list(args))
    return rc, out.getvalue()


def test_tune_with_staleness_proposes_a_split_and_writes_its_fully_async_launch(tmp_path):
    rc, text = _run("tune", str(EXAMPLE), "--staleness", "1", "--out", str(tmp_path), "--json")
    assert rc == 0, text
    d = json.loads(text)
    sp = d["split"]
    assert sp is not None, "the split wins on this launch as the cost model prices it"
    f = sp["placement"]
    assert f["mode"] == "separate" and f["staleness"] <= 1
    assert f["rollout_gpus"] + f["train_gpus"] == d["gpus"]
    assert sp["time"]["step_s"] < d["best"]["step_s"]  # it beats the tuned colocated launch
    assert sp["speedup_over_tuned"] > 1.0
    verl_sh = Path(sp["run_dir"]) / "verl.sh"
    assert "verl.experimental.fully_async_policy.fully_async_main" in verl_sh.read_text()


def test_tune_without_staleness_stays_colocated(tmp_path):
    rc, text = _run("tune", str(EXAMPLE), "--out", str(tmp_path), "--json")
    assert rc == 0, text
    assert "split" not in json.loads(text)


def test_tune_reads_a_fully_async_launch_back_as_separate_pools(tmp_path):
    # the split tune proposes, written as verl's fully-async launch, read back by tune: the same pools and price
    rc, text = _run("tune", str(EXAMPLE), "--staleness", "1", "--out", str(tmp_path / "a"), "--json")
    assert rc == 0, text
    sp = json.loads(text)["split"]
    rc, text = _run("tune", str(Path(sp["run_dir"]) / "verl.sh"), "--out", str(tmp_path / "b"), "--json")
    assert rc == 0, text
    d = json.loads(text)
    cur = d["current"]
    for k in ("rollout_gpus", "train_gpus", "staleness", "partial_rollout"):
        assert cur["placement"][k] == sp["placement"][k], k
    assert cur["strategy"]["tp"] == sp["strategy"]["tp"] and cur["strategy"]["ep"] == sp["strategy"]["ep"]
    assert cur["time"]["step_s"] == pytest.approx(sp["time"]["step_s"], rel=1e-6)
    assert d["best"]["time"]["step_s"] <= cur["time"]["step_s"]


def _searched(rollout_gpus: int):
    """search_placement's result for qwen2.5-1.5b on 8 H100, ``rollout_gpus`` of them rolling out, staleness 1."""
    from grpo_tune.autotune.search.placement import search_placement
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Cluster, Workload

    return search_placement(
        load_model("qwen2.5-1.5b"),
        load_hardware("h100"),
        Cluster(gpus=8),
        Workload(prompts=256, mini_batch=64),
        placement="separate",
        rollout_gpus=rollout_gpus,
        staleness=1,
    )


def _fractional_launch(tmp_path: Path, rollout_gpus: int = 6, threshold: str = "0.5") -> Path:
    """A fully-async launch of qwen2.5-1.5b on 8 H100 (``rollout_gpus`` of them rolling out) at a fractional
    ``staleness_threshold``: tune's own emitted launch with the fraction written in."""
    from grpo_tune.rundir.emit import emit

    res = _searched(rollout_gpus)
    assert res.best_separate is not None
    whole = emit(res.best_separate, tmp_path / "emitted")["verl"]
    assert "async_training.staleness_threshold=1.0 " in whole.read_text()
    f = tmp_path / "launch.sh"
    f.write_text(whole.read_text().replace("staleness_threshold=1.0 ", f"staleness_threshold={threshold} "))
    return f


def _retune(launch: Path, out: Path, staleness: int = 0):
    from grpo_tune.core.placement import PlacementAsk
    from grpo_tune.jobs.setup import prepare
    from grpo_tune.jobs.tune import TuneRequest, run_tune

    place = PlacementAsk(placement="separate", staleness=staleness) if staleness else PlacementAsk()
    o = run_tune(TuneRequest(launch=launch, model="qwen2.5-1.5b", out=out, place=place, setup=prepare(None)))
    assert o.separate is not None and o.run_dir is not None
    return o.separate, (o.run_dir / "tuned.sh").read_text()


def test_a_fractional_launch_is_retuned_at_its_own_run_ahead_and_reads_back_at_its_price(tmp_path):
    """A launch at staleness_threshold 0.5 is re-searched with the pool half a batch ahead, as it is priced: the
    plan found and its tuned.sh read back price the same step (the fraction kept as the user wrote it). Before
    issue 36's fix the re-search priced staleness 1 a whole batch ahead: it found 3 + 5 GPUs at 8.18 s while
    the tuned.sh it wrote (still 0.5) read back at 10.09 s."""
    sep, tuned = _retune(_fractional_launch(tmp_path), tmp_path / "t")
    found, back, cur = sep.found, sep.best, sep.current
    assert found is not None and back is not cur, "6 of 8 GPUs rolling out leaves a faster split to find"
    assert cur.placement["rollout_ahead"] == 0.5 and cur.placement["staleness"] == 1
    assert found.placement["rollout_ahead"] == back.placement["rollout_ahead"] == 0.5
    assert found.placement["staleness"] == back.placement["staleness"] == 1
    assert back.step_s == pytest.approx(found.step_s, rel=1e-9)  # the plan's price is what tuned.sh runs
    assert back.step_s < cur.step_s
    assert "async_training.staleness_threshold=0.5 " in tuned and "async_training.staleness_threshold" not in {
        k for k in sep.changes
    }


def test_a_separate_best_yaml_is_read_with_its_pools(tmp_path):
    """A run config of a separate plan is read with its placement (its strategy is the training pool's), and tune
    says it edits launches, pointing at the run folder's verl.sh; it said INVALID_DEGREES when the training layout
    did not divide the whole cluster."""
    from grpo_tune.frameworks import read_plan
    from grpo_tune.rundir.emit import emit

    res = _searched(2)
    e = res.best_separate
    assert e is not None and e.placement["train_gpus"] == 6
    files = emit(e, tmp_path / "run")
    p = read_plan(files["best"])
    assert p.placement is not None and p.placement.rollout_gpus == 2 and p.placement.staleness == 1
    assert p.strategy.layout.dp * p.strategy.layout.tp * p.strategy.layout.pp * p.strategy.layout.cp == 6
    rc, text = _run("tune", str(files["best"]), "--out", str(tmp_path / "t"))
    assert rc == 2 and "a run config, not a verl launch" in text and "verl.sh" in text, text
    assert not (tmp_path / "t").exists()  # refused before any search or output


def test_the_split_proposal_is_the_users_launch_switched_to_fully_async(tmp_path):
    """The proposal's run folder holds tuned.sh: the user's colocated launch with its module and --config-name
    switched to verl's fully-async trainer and only priced keys (and what that trainer asserts) changed, each
    reported; it composes against the 0.9.1 wheel's fully-async config."""
    from grpo_tune.frameworks.verl import fully_async
    from grpo_tune.frameworks.verl import snapshot as verl
    from grpo_tune.frameworks.verl.diagnose import parse_script
    from grpo_tune.frameworks.verl.retune import SWITCH_KEYS, priced_keys

    rc, text = _run("tune", str(EXAMPLE), "--staleness", "1", "--out", str(tmp_path), "--json")
    assert rc == 0, text
    sp = json.loads(text)["split"]
    tuned = Path(sp["run_dir"]) / "tuned.sh"
    t = tuned.read_text()
    assert f"-m {fully_async.ENTRY} --config-name={fully_async.CONFIG_NAME} " in t
    before, _, _ = parse_script(EXAMPLE.read_text())
    after, _, facts = parse_script(t)
    assert facts["config_name"] == fully_async.CONFIG_NAME
    b, a = {o.key: o.raw for o in before}, {o.key: o.raw for o in after}
    changed = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
    assert changed <= priced_keys() | set(SWITCH_KEYS), sorted(changed - priced_keys() - set(SWITCH_KEYS))
    assert changed <= set(sp["overrides"])
    tree = verl.flatten(fully_async.compose([f"{o.prefix}{o.key}={o.raw}" for o in after]))
    assert tree["data.train_batch_size"] == 0 and tree["actor_rollout_ref.hybrid_engine"] is False
    assert tree["actor_rollout_ref.rollout.mode"] == "async"
    f = sp["placement"]
    assert tree["rollout.nnodes"] * tree["rollout.n_gpus_per_node"] == f["rollout_gpus"]
    assert tree["trainer.nnodes"] * tree["trainer.n_gpus_per_node"] == f["train_gpus"]
    for k in ("data.train_files", "actor_rollout_ref.actor.optim.lr", "trainer.logger"):
        assert a.get(k) == b.get(k), k


@pytest.mark.slow
def test_a_fractional_staleness_threshold_is_priced_as_the_fraction(tmp_path):
    """verl 0.9.1's rollouter runs ahead by (1 + staleness_threshold) x a version's samples: a launch with 0.5 is
    read at staleness ceil(0.5) = 1 (the versions a sample may lag) and priced with the pool half a batch ahead, not
    a whole one; tune's rewrite keeps the fraction as written and prices what it writes (issue 36)."""
    from grpo_tune.costmodel.pools import AsyncKnobs, estimate_separate
    from grpo_tune.frameworks import read_plan
    from grpo_tune.rundir.emit import emit

    res = _searched(2)
    assert res.best_separate is not None
    whole = emit(res.best_separate, tmp_path / "run")["verl"]
    assert "async_training.staleness_threshold=1.0 " in whole.read_text()
    half = tmp_path / "half.sh"
    half.write_text(whole.read_text().replace("staleness_threshold=1.0 ", "staleness_threshold=0.5 "))
    p1, p05 = read_plan(whole), read_plan(half)
    assert p1.placement is not None and p05.placement is not None
    assert p1.placement.staleness == p05.placement.staleness == 1
    assert p1.ahead is None and p05.ahead == 0.5

    def price(p, ahead):
        return estimate_separate(
            model=p.model,
            hardware=p.hardware,
            cluster=p.cluster,
            strategy=p.strategy,
            workload=p.workload,
            placement=p.placement,
            knobs=AsyncKnobs(ahead=ahead),
        ).step_s

    rc, text = _run("tune", str(half), "--out", str(tmp_path / "t"), "--json")
    assert rc == 0, text
    cur = json.loads(text)["current"]["time"]["step_s"]
    assert cur == pytest.approx(price(p05, 0.5), rel=1e-9)  # the fraction, as written
    assert price(p05, 0.5) != pytest.approx(price(p05, 1.0), rel=1e-6)  # and it is not ceil()'s price
    tuned = tmp_path / "t" / "tuned.sh"
    if tuned.exists():  # the rewrite keeps the user's fraction
        assert "staleness_threshold=0.5 " in tuned.read_text()
    rc, text = _run("tune", str(half), "--no-emit")  # and says so
    flat = " ".join(text.split())  # the line as the terminal wraps it
    assert rc == 0 and "as launched: 2 rollout + 6 training GPUs, staleness 1 (0.5 of a batch ahead)" in flat, text


@pytest.mark.slow
def test_a_staleness_asked_for_searches_integers_beside_the_launchs_fraction(tmp_path):
    """With --staleness 2 the user asks for other staleness values: staleness 1 is still the launch's 0.5 (the
    fraction ceil() reads as 1, kept as written when it wins) and 0 and 2 are priced as integers; a winner at
    another staleness rewrites staleness_threshold to it, and tuned.sh reads back at the plan's price."""
    sep, tuned = _retune(_fractional_launch(tmp_path), tmp_path / "t", staleness=2)
    found, back = sep.found, sep.best
    assert found is not None and back is not sep.current
    k = found.placement["staleness"]
    assert found.placement["rollout_ahead"] == (0.5 if k == 1 else k)
    assert back.placement["rollout_ahead"] == found.placement["rollout_ahead"]
    assert back.step_s == pytest.approx(found.step_s, rel=1e-9)
    assert f"async_training.staleness_threshold={0.5 if k == 1 else float(k)} " in tuned
