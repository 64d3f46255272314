"""The run-config schema: round trip, coded rejections, atomic writes, and a fuzzed loader."""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_tune.autotune.calibrate import fit as calibration
from grpo_tune.core.config import SCHEMA_VERSION, RunConfig, TrainerOptions, atomic_write, dumps, load, save
from grpo_tune.core.errors import CODES, ConfigError, GrpoTuneError
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload, validate


def make_cfg(**kw) -> RunConfig:
    m = load_model("qwen2.5-7b")
    s = validate(m, Strategy.of(tp=2, pp=2, offload=("param",)), 8)
    base = dict(
        model=m,
        hardware=load_hardware("h100"),
        cluster=Cluster(gpus=8),
        strategy=s,
        workload=Workload(prompts=512, mini_batch=128),
        trainer=TrainerOptions(steps=3),
        predicted={"step_s": 12.5},
        meta={"by": "test"},
    )
    base.update(kw)
    return RunConfig(**base)


def test_round_trip(tmp_path):
    cfg = make_cfg()
    p = save(cfg, tmp_path / "sub" / "best.yaml")
    back = load(p)
    assert back == cfg
    assert back.to_dict() == cfg.to_dict()
    assert p.read_text().startswith("# grpo-tune run config")
    assert yaml.safe_load(p.read_text())["schema_version"] == SCHEMA_VERSION


def test_model_and_hardware_by_name(tmp_path):
    d = make_cfg().to_dict()
    d["model"], d["hardware"] = "7b", {"name": "h100"}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(d))
    cfg = load(tmp_path / "c.yaml")
    assert cfg.model.name == "qwen2.5-7b" and cfg.hardware.name == "h100-sxm-80gb"


@pytest.mark.parametrize(
    "mutate,code,text",
    [
        (lambda d: d.update(extra=1), "UNKNOWN_KEY", "unknown section 'extra'"),
        (lambda d: d["strategy"].update(tensor_parallel=2), "UNKNOWN_KEY", "tensor_parallel"),
        (lambda d: d["trainer"].update(lr_rate=1.0), "UNKNOWN_KEY", "lr_rate"),
        (lambda d: d.update(schema_version=99), "BAD_CONFIG", "schema_version 99"),
        (lambda d: d.pop("cluster"), "BAD_CONFIG", "missing section 'cluster'"),
        (lambda d: d["strategy"].update(tp=3), "INVALID_DEGREES", "does not divide"),
        (lambda d: d["strategy"].update(tp=-1), "BAD_CONFIG", "positive integer"),
        (lambda d: d["strategy"].update(gpu_memory_utilization=1.5), "BAD_CONFIG", r"\(0, 1\]"),
        (lambda d: d["strategy"].update(recompute="some"), "BAD_CONFIG", "recompute"),
        (lambda d: d["strategy"].update(offload=["params"]), "BAD_CONFIG", "offload"),
        (lambda d: d["workload"].update(mini_batch=1024), "BAD_CONFIG", "exceeds prompts"),
        (lambda d: d["trainer"].update(kl_type="bogus"), "BAD_CONFIG", "kl_type"),
        (lambda d: d.update(model="no-such-model"), "UNKNOWN_MODEL", "no-such-model"),
        (lambda d: d.update(hardware="tpu-v9"), "UNKNOWN_HARDWARE", "tpu-v9"),
        (lambda d: d["model"].update(heads=0), "BAD_CONFIG", "heads"),
    ],
)
def test_coded_rejections(tmp_path, mutate, code, text):
    d = make_cfg().to_dict()
    mutate(d)
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(GrpoTuneError, match=text) as exc:
        load(p)
    assert exc.value.code == code


@pytest.mark.parametrize(
    "loader,name,content,error,match",
    [
        (load, "c.yaml", None, GrpoTuneError, "no config file"),
        (load, "c.yaml", b"model: [unclosed", GrpoTuneError, "not valid YAML"),
        (load, "c.yaml", b"\xff\xfe\x00bad", GrpoTuneError, None),
        (calibration.load, "c.json", None, ConfigError, "no calibration file"),
        (calibration.load, "c.json", b"{not json", ConfigError, "not a readable"),
    ],
)
def test_unreadable_files_are_coded(tmp_path, loader, name, content, error, match):
    """A run config or a calibration file that is missing or not parseable is a coded error, not a traceback."""
    p = tmp_path / name
    if content is not None:
        p.write_bytes(content)
    with pytest.raises(error, match=match):
        loader(p)


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path):
    p = tmp_path / "best.yaml"
    atomic_write(p, "old\n")

    class Boom(Exception):
        pass

    class Exploding(str):
        def encode(self, *a, **k):  # fail after the temporary file exists
            raise Boom()

    with pytest.raises(Boom):
        atomic_write(p, Exploding("new"))
    assert p.read_text() == "old\n"
    assert [f.name for f in tmp_path.iterdir()] == ["best.yaml"]  # no temporary left behind
    atomic_write(p, "new\n")
    assert p.read_text() == "new\n"


# ---------------------------------------------------------------------------------------------
# Fuzzing the loader: random YAML and randomly corrupted configs give a RunConfig or a coded error.
# ---------------------------------------------------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
VALUES = st.recursive(
    SCALARS,
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=6), c, max_size=3)),
    max_leaves=6,
)
BASE = make_cfg().to_dict()


def _load_text(text: str):
    """The loaded config, or None after a coded error that says where and what (never a bare exception)."""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "c.yaml"
        p.write_text(text)
        try:
            return load(p)
        except GrpoTuneError as exc:
            assert exc.code in CODES, exc.code
            assert str(exc) == f"[{exc.code}] {exc.message}" and exc.message.strip()
            assert exc.hint.strip(), f"[{exc.code}] {exc.message} has no hint"
            return None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=200))
def test_random_text_gives_coded_errors(text):
    # Random text is never a run config: it must be refused, and only as malformed YAML/shape or an unknown key.
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "c.yaml"
        p.write_text(text)
        with pytest.raises(GrpoTuneError) as exc:
            load(p)
    assert exc.value.code in ("BAD_CONFIG", "UNKNOWN_KEY"), str(exc.value)
    assert exc.value.hint.strip()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    section=st.sampled_from(
        ["model", "hardware", "cluster", "strategy", "workload", "trainer", "predicted", "schema_version", "meta"]
    ),
    key=st.one_of(
        st.sampled_from(
            [
                "tp",
                "pp",
                "gpus",
                "layers",
                "heads",
                "hbm_bytes",
                "steps",
                "lr",
                "prompts",
                "offload",
                "name",
                "vocab",
                "experts",
                "gpus_per_node",
                "rollout_engine",
            ]
        ),
        st.text(max_size=5),
    ),
    value=VALUES,
    whole=st.booleans(),
)
def test_corrupted_configs_give_coded_errors(section, key, value, whole):
    d = copy.deepcopy(BASE)
    if whole or not isinstance(d.get(section), dict):
        d[section] = value
    else:
        d[section][key] = value
    try:
        text = yaml.safe_dump(d)
    except yaml.YAMLError:
        return
    cfg = _load_text(text)
    if cfg is not None:  # accepted: then it is a real, consistent plan
        s = cfg.strategy
        assert s.layout.tp * s.layout.pp * s.layout.cp * s.layout.dp == cfg.cluster.gpus


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    section=st.sampled_from(["model", "hardware", "cluster", "strategy", "workload", "trainer"]),
    key=st.sampled_from(
        [
            "tp",
            "pp",
            "offload",
            "gpus",
            "layers",
            "heads",
            "kv_heads",
            "experts",
            "top_k",
            "hbm_bytes",
            "efficiency",
            "aliases",
            "steps",
            "lr",
            "prompts",
            "kind",
            "name",
            "first_stage_layers",
            "dataset",
            "vocab",
            "source",
        ]
    ),
    value=VALUES,
)
def test_from_dict_needs_no_safety_net(section, key, value):
    """RunConfig.from_dict itself raises only coded errors (load() also turns a stray TypeError into
    one, as a last line of defence; this checks that the defence is not what saves us)."""
    d = copy.deepcopy(BASE)
    d[section][key] = value
    try:
        RunConfig.from_dict(d)
    except GrpoTuneError:
        pass


def test_save_is_readable_by_others_atomically(tmp_path):
    """A reader polling the file never sees a torn write."""
    p = tmp_path / "best.yaml"
    cfg = make_cfg()
    save(cfg, p)
    for i in range(20):
        save(cfg.replace(meta={"i": i}), p)
        assert load(p).meta == {"i": i}
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    assert dumps(cfg).count("schema_version") == 2  # header comment + key


def test_exponent_floats_without_a_dot_load_as_numbers(tmp_path):
    """YAML 1.1 reads ``3e-3`` as a string; users write it that way, so the loader reads it as 1.2 does."""
    from grpo_tune.core.config import Cluster, RunConfig, load, save
    from grpo_tune.core.specs import load_hardware, load_model
    from grpo_tune.core.strategy import Strategy

    cfg = RunConfig(
        model=load_model("tiny"),
        hardware=load_hardware("cpu"),
        cluster=Cluster(gpus=1, gpus_per_node=1),
        strategy=Strategy(),
    )
    p = tmp_path / "c.yaml"
    save(cfg, p)
    p.write_text(p.read_text().replace("lr: 1.0e-06", "lr: 3e-3"))
    assert load(p).trainer.lr == 0.003
