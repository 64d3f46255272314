"""The knob table (core/knobs.py) is the one list of plan knobs: flags, pins, the search space, tune and the
verl table read it, and a plan is composed of one dataclass per concern.

The last test adds a knob in this module only (one field on a concern's dataclass, one table row, one verl
row) and sees it reach the CLI flags, the pins, the search space and the verl table's round trip.
"""

from __future__ import annotations

import dataclasses

import pytest
import typer
from typer.testing import CliRunner

from grpo_tune.autotune import tune as TU
from grpo_tune.autotune.search import candidates as SP
from grpo_tune.cli import options as O
from grpo_tune.cli import plan_options as PO
from grpo_tune.frameworks.verl import snapshot as verl
from grpo_tune.frameworks.verl import table
from grpo_tune.core import knobs as K
from grpo_tune.core import strategy as ST
from grpo_tune.core.errors import ConfigError
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Batching, Cluster, Layout, Memory, Precision, Rollout, Strategy, Workload

# The order a plan's strategy section has listed its keys in since schema 1 (best.yaml, --json): the
# table keeps it, so every emitted plan reads byte for byte as before.
SECTION_ORDER = [
    "tp", "pp", "vpp", "cp", "ep", "etp", "dp", "mbs", "log_prob_mbs", "sequence_parallel", "recompute",
    "recompute_layers", "distributed_optimizer", "offload", "first_stage_layers", "last_stage_layers",
    "rollout_tp", "gpu_memory_utilization", "max_tokens_per_gpu", "log_prob_max_tokens_per_gpu",
    "cpu_optimizer", "overlap_cpu_optimizer", "precision_aware_optimizer", "max_num_seqs",
    "max_num_batched_tokens", "enforce_eager", "chunked_prefill", "free_cache_engine", "sync_bucket_mb",
    "fused_kernels", "engine", "precision", "rollout_precision", "kv_cache_dtype",
]  # fmt: skip
QUIET = {"engine", "precision", "rollout_precision", "kv_cache_dtype"}
"""Added after schema 1: left out of a plan's section at their defaults, so every emitted plan reads as before."""


def test_every_concern_field_is_one_row_in_section_order():
    rows = [k.name for k in K.KNOBS]
    assert rows == SECTION_ORDER and len(set(rows)) == len(rows)
    concern_fields = {
        c: [f.name for f in dataclasses.fields(cls)]
        for c, cls in (
            ("layout", Layout),
            ("memory", Memory),
            ("batching", Batching),
            ("rollout", Rollout),
            ("precision", Precision),
        )
    }
    for k in K.KNOBS:
        assert k.field in concern_fields[k.concern], k.name
    assert sorted(f for fs in concern_fields.values() for f in fs) == sorted(rows)
    assert list(Strategy().to_dict()) == [n for n in SECTION_ORDER if n != "log_prob_mbs" and n not in QUIET]


def test_the_readers_name_what_they_named_before():
    """The lists the table replaced, as they were spelled by hand (the table must reproduce each as a set)."""
    degrees = {"tp", "pp", "vpp", "cp", "ep", "etp"}
    assert set(O.pin_flags()) == degrees | {
        "mbs", "log_prob_mbs", "recompute", "sequence_parallel", "distributed_optimizer", "offload", "rollout_tp",
        "gpu_memory_utilization", "first_stage_layers", "last_stage_layers", "max_tokens_per_gpu", "cpu_optimizer",
        "max_num_seqs", "enforce_eager", "sync_bucket_mb", "precision_aware_optimizer",
        "engine", "precision", "rollout_precision", "kv_cache_dtype",
    }  # fmt: skip
    assert {k.name for k in K.KNOBS if k.pin.range == K.POSITIVE and k.pin.error.endswith(">= 1, got {v}")} == (
        degrees
        | {"mbs", "log_prob_mbs", "rollout_tp", "first_stage_layers", "last_stage_layers", "sync_bucket_mb"}
        | {"max_num_seqs"}
    )
    assert {k.name for k in K.KNOBS if k.pin.zero_is_off} == {"max_tokens_per_gpu", "cpu_optimizer"}
    assert set(TU.SEARCHED) == degrees | {
        "mbs", "log_prob_mbs", "recompute", "offload", "distributed_optimizer", "rollout_tp",
        "gpu_memory_utilization", "first_stage_layers", "last_stage_layers", "sync_bucket_mb",
    }  # fmt: skip
    engine = {
        "max_tokens_per_gpu", "log_prob_max_tokens_per_gpu", "log_prob_mbs", "cpu_optimizer", "overlap_cpu_optimizer",
        "precision_aware_optimizer", "max_num_seqs", "max_num_batched_tokens", "enforce_eager", "chunked_prefill",
        "free_cache_engine", "sync_bucket_mb", "engine", "precision", "rollout_precision", "kv_cache_dtype",
    }  # fmt: skip
    assert set(TU.PINNED) == engine and set(TU.USER_FIELDS) == engine | {"sequence_parallel"}
    assert [n for n, *_ in PO.DEGREE_FLAGS] == ["gpus_per_node", "stack", *O.pin_flags()]


def test_of_and_replace_route_flat_names_to_their_concern():
    s = Strategy.of(tp=2, mbs=4, recompute="full", rollout_tp=4, fused_kernels=True)
    assert (s.layout.tp, s.batching.mbs, s.memory.recompute, s.rollout.rollout_tp) == (2, 4, "full", 4)
    assert s.memory.fused_kernels and s.knob("rollout_tp") == 4 and s.knob("etp_") == 2
    t = s.replace(pp=2, enforce_eager=True)
    assert (t.layout.tp, t.layout.pp, t.rollout.enforce_eager, s.layout.pp) == (2, 2, True, 1)
    assert t.memory is s.memory and t.batching is s.batching  # untouched concerns are shared, not copied
    assert Strategy.from_dict(t.to_dict()) == t
    with pytest.raises(TypeError):
        s.replace(bogus=1)
    with pytest.raises(AttributeError):
        s.knob("bogus")


def test_pins_are_checked_by_their_row():
    assert O.strategy_pins(tp=2, cpu_optimizer=0.5, max_tokens_per_gpu=0) == {
        "tp": 2,
        "max_tokens_per_gpu": None,
        "cpu_optimizer": 0.5,
        "overlap_cpu_optimizer": True,
        "precision_aware_optimizer": True,
    }
    assert O.strategy_pins(cpu_optimizer=1.0, precision_aware_optimizer=False)["precision_aware_optimizer"] is False
    for bad, msg in (
        ({"tp": 0}, "--tp must be >= 1, got 0"),
        ({"recompute": "some"}, "--recompute must be one of none, selective, full, got 'some'"),
        ({"gpu_memory_utilization": 1.5}, "must be a fraction in (0, 1], got 1.5"),
        ({"cpu_optimizer": float("nan")}, "--cpu-optimizer must be a fraction in [0, 1] (0 = off), got nan"),
        ({"max_tokens_per_gpu": -1}, "--max-tokens-per-gpu must be >= 0 (0 = off), got -1"),
        ({"offload": "param"}, "not one alone"),
    ):
        with pytest.raises(ConfigError, match=None) as e:
            O.strategy_pins(**bad)
        assert msg in str(e.value), bad
    with pytest.raises(ConfigError) as e:
        O.strategy_pins(sync_bucket_mb=0)
    assert e.value.hint == "leave --sync-bucket-mb out for verl's default (2048 MiB)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class _RolloutPlus(Rollout):
    """The rollout concern with one more field (a knob added in this module only)."""

    spec_tokens: int = 0
    """Speculative tokens per decode step (made up for this test)."""


_SPEC = K.Knob(
    "spec_tokens",
    "rollout",
    flag="--spec-tokens",
    help="Speculative tokens per step.",
    panel=K.P_ROLL,
    pin=K.Pin(range=K.NON_NEGATIVE, error="{flag} must be >= 0, got {v}", hint=None),
    search="grid",
    values=(0, 4),
    tune="user",
)


@pytest.fixture
def spec_knob(monkeypatch):
    """One field and one row (and the verl key it is written to): what adding a knob takes."""
    monkeypatch.setattr(K, "KNOBS", (*K.KNOBS, _SPEC))
    monkeypatch.setitem(ST._CONCERN_TYPES, "rollout", _RolloutPlus)
    monkeypatch.setattr(ST, "_DEFAULT", Strategy(rollout=_RolloutPlus()))
    key = "+actor_rollout_ref.rollout.engine_kwargs.vllm.num_speculative_tokens"
    monkeypatch.setattr(table, "ROWS", (*table.ROWS, table.same("strategy", "spec_tokens", key)))
    return key


def test_a_knob_added_in_one_place_reaches_flags_pins_space_and_the_verl_table(spec_knob):
    # the flag: a command built from the table's flags takes --spec-tokens, and its value becomes a pin
    app = typer.Typer()

    @app.command()
    @PO.flags_after(None, PO.knob_flags())
    def cmd(**pins):
        print(O.strategy_pins(**{k: pins.get(k) for k in O.pin_flags()}))

    out = CliRunner().invoke(app, ["--spec-tokens", "4", "--tp", "2"])
    assert out.exit_code == 0, out.output
    assert "'spec_tokens': 4" in out.output and "'tp': 2" in out.output
    # the pin rule
    with pytest.raises(ConfigError, match="--spec-tokens must be >= 0, got -1"):
        O.strategy_pins(spec_tokens=-1)
    # the plan: a field of its concern, in the strategy section, read back
    s = Strategy.of(spec_tokens=4)
    assert s.rollout.spec_tokens == 4 and s.to_dict()["spec_tokens"] == 4
    assert Strategy.from_dict(s.to_dict()) == s
    # the search space: unpinned, both grid values; pinned, the pin
    m, hw = load_model("tiny"), load_hardware("h100")
    wl = Workload(prompts=8, n=2, mini_batch=8, prompt_len=64, response_len=64)
    free = SP.Space(model=m, hardware=hw, cluster=Cluster(gpus=2, gpus_per_node=2), workload=wl)
    assert sorted({e["spec_tokens"] for e in free.engine_options()}) == [0, 4]
    assert {c.rollout.spec_tokens for c in free.candidates()} == {0, 4}
    pinned = dataclasses.replace(free, pins={"spec_tokens": 4})
    assert {c.rollout.spec_tokens for c in pinned.candidates()} == {4}
    # the verl table: written to its key and read back
    plan = {"strategy": s, "workload": wl, "trainer": table.TrainerOptions(), "cluster": Cluster(gpus=2)}
    written = table.write_sections(plan)
    assert written[spec_knob] == 4
    values = {k.lstrip("+"): v for k, v in written.items()}
    back = table.read_sections(lambda k: values[k] if k in values else verl.default(k))
    assert back["strategy"].rollout.spec_tokens == 4


def test_one_rollout_engine_vocabulary():
    """The plan names the engine as the trainer does (vllm | megatron; the trainer adds auto); the cpu platform only
    makes megatron the default of its plans. A run config written while the engine was the hardware profile's
    (``hardware.rollout_engine``, the old ``megatron-native`` included) reads as that plan, priced the same; a
    hardware file that still names one is a coded BAD_CONFIG."""
    from grpo_tune.core.choices import PlanEngine
    from grpo_tune.core.choices import TrainerRolloutEngine as Engines
    from grpo_tune.core.config import RunConfig
    from grpo_tune.core.hardware import ROLLOUT_ENGINES, HardwareSpec
    from grpo_tune.core.target import inputs_of
    from grpo_tune.costmodel.estimate import estimate
    from grpo_tune.costmodel.results import step_s
    from grpo_tune.rundir.emit import run_config

    assert set(ROLLOUT_ENGINES) == set(Engines.values()) - {"auto"} <= set(PlanEngine.values())
    cpu = load_hardware("cpu")
    assert cpu.default_engine == "megatron" and load_hardware("h100").default_engine == "vllm"
    assert not hasattr(cpu, "rollout_engine") and not hasattr(cpu, "native_rollout")
    with pytest.raises(ConfigError, match="rollout engine is the plan's") as e:
        HardwareSpec.from_dict({**cpu.to_dict(), "rollout_engine": "megatron"})
    assert e.value.code == "BAD_CONFIG" and "--rollout-engine" in (e.value.hint or "")
    est = estimate(
        model=load_model("tiny"),
        hardware=cpu,
        cluster=Cluster(gpus=1, gpus_per_node=1),
        strategy=Strategy.of(mbs=8, engine="megatron"),
        workload=Workload(prompts=4, n=4, mini_batch=4, prompt_len=8, response_len=8, kl=False),
    )
    now = run_config(est).to_dict()
    assert now["strategy"]["engine"] == "megatron" and "rollout_engine" not in now["hardware"]
    for old in ("megatron", "megatron-native"):
        doc = {**now, "hardware": {**now["hardware"], "rollout_engine": old}}
        doc["strategy"] = {k: v for k, v in now["strategy"].items() if k != "engine"}
        back = RunConfig.from_dict(doc)
        assert back.strategy.rollout.engine == "megatron" and back.hardware == cpu
        assert step_s(estimate(**inputs_of(back))) == step_s(est)


# --- a knob is priced: moving it moves the estimate (issue 37) -------------------------------------------------
# Each knob with a flag, the plan it is moved on (model, GPUs, the other knobs) and the value it is moved to.
_BASE7 = ("qwen2.5-7b", 8, dict(tp=2, rollout_tp=2, mbs=2, recompute="selective"))
_PP = ("qwen2.5-7b", 8, dict(tp=2, pp=2, rollout_tp=2, mbs=1, recompute="selective"))
_MOE = ("qwen3-30b-a3b", 16, dict(tp=2, ep=4, rollout_tp=2, mbs=1, recompute="full"))
MOVES: dict[str, tuple[tuple[str, int, dict], object]] = {
    "tp": (_BASE7, 4),
    "pp": (_BASE7, 2),
    "vpp": (_PP, 2),
    "cp": (_BASE7, 2),
    "ep": (_MOE, 8),
    "etp": (_MOE, 1),
    "mbs": (_BASE7, 4),
    "log_prob_mbs": (_BASE7, 8),
    "first_stage_layers": (_PP, 12),
    "last_stage_layers": (_PP, 12),
    "sequence_parallel": (_BASE7, False),
    "recompute": (_BASE7, "full"),
    "distributed_optimizer": (_BASE7, False),
    "offload": (_BASE7, ("param", "grad", "optimizer")),
    "rollout_tp": (_BASE7, 4),
    "gpu_memory_utilization": (_BASE7, 0.8),
    "max_tokens_per_gpu": (_BASE7, 16384),
    "cpu_optimizer": (_BASE7, 0.5),
    "precision_aware_optimizer": (_BASE7, True),
    "max_num_seqs": (_BASE7, 32),
    "enforce_eager": (_BASE7, True),
    "sync_bucket_mb": (_BASE7, 64),
    "engine": (_BASE7, "sglang"),
    "precision": (_BASE7, "fp8"),
    "rollout_precision": (_BASE7, "fp8"),
    "kv_cache_dtype": (_BASE7, "fp8"),
}
# The phase that a precision or engine knob must make shorter (docs/precision.md says why).
FASTER = {"engine": "rollout", "precision": "update", "rollout_precision": "rollout", "kv_cache_dtype": "rollout"}


def _priced(model: str, gpus: int, knobs: dict) -> dict:
    from grpo_tune.costmodel.estimate import estimate

    m = load_model(model)
    s = ST.validate(m, Strategy.of(**knobs), gpus, gpus_per_node=8)
    wl = Workload(response_len=4096)  # long enough that the KV cache and the decode's context matter
    return estimate(
        model=m, hardware=load_hardware("h100"), cluster=Cluster(gpus=gpus), strategy=s, workload=wl
    ).predicted()


def test_every_flag_knob_has_a_move():
    assert set(MOVES) == set(O.pin_flags())


@pytest.mark.parametrize("name", sorted(MOVES))
def test_a_knob_moves_the_estimate(name):
    """Every knob a user can set is priced: the estimate (phase seconds or bytes per phase) changes when it does;
    the precision and engine knobs shorten the phase they act on."""
    (model, gpus, base), value = MOVES[name]
    before = _priced(model, gpus, base)
    after = _priced(model, gpus, {**base, name: value})
    moved = {k: (before[k], after[k]) for k in ("phases_s", "memory_bytes") if before[k] != after[k]}
    assert moved, f"{name}={value!r} changes no price"
    if name in FASTER:
        ph = FASTER[name]
        assert after["phases_s"][ph] < before["phases_s"][ph], (name, before["phases_s"], after["phases_s"])


def test_every_framework_table_has_a_row_for_every_knob():
    """verl's and NeMo-RL's tables name every plan knob: the keys it writes, or why the framework has none (a
    knob added to core/knobs.py without its rows fails here)."""
    from grpo_tune.frameworks.nemo_rl import table as nemo

    for t in (table, nemo):
        assert {r.field for r in t.rows("strategy")} >= set(Strategy.knob_names()), t.__name__
