"""diagnose never raises on a parsable launch: random degrees, batches and junk values give only
coded findings; run configs (best.yaml) are diagnosed through their verl export."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_tune.core.config import save
from grpo_tune.frameworks.verl.diagnose import Finding, diagnose_overrides, diagnose_path, parse_script
from grpo_tune.frameworks.verl.export import verl_script
from grpo_tune.core.errors import CODES, GrpoTuneError
from _export_configs import configs, make

A = "actor_rollout_ref.actor.megatron"
R = "actor_rollout_ref.ref.megatron"
RO = "actor_rollout_ref.rollout"

degree = st.one_of(st.integers(-2, 300), st.sampled_from(["null", "true", "abc", "$TP", "2.5", "[1,2]", ""]))
small = st.integers(1, 16)


@st.composite
def launches(draw):
    ov = {
        f"{A}.tensor_model_parallel_size": draw(st.one_of(small, degree)),
        f"{A}.pipeline_model_parallel_size": draw(st.one_of(small, degree)),
        f"{A}.context_parallel_size": draw(st.one_of(st.integers(1, 4), degree)),
        f"{A}.expert_model_parallel_size": draw(st.one_of(small, degree)),
        f"{A}.expert_tensor_parallel_size": draw(st.one_of(st.just("null"), small, degree)),
        f"{A}.virtual_pipeline_model_parallel_size": draw(st.one_of(st.just("null"), st.integers(1, 4), degree)),
        f"{RO}.tensor_model_parallel_size": draw(st.one_of(small, degree)),
        f"{RO}.gpu_memory_utilization": draw(st.one_of(st.floats(-1, 2), st.sampled_from(["x", "nan", "inf"]))),
        f"{RO}.n": draw(st.one_of(small, degree)),
        "data.train_batch_size": draw(st.one_of(st.integers(1, 4096), degree)),
        "actor_rollout_ref.actor.ppo_mini_batch_size": draw(st.one_of(st.integers(1, 1024), degree)),
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": draw(st.one_of(small, degree)),
        "trainer.n_gpus_per_node": draw(st.one_of(st.sampled_from([1, 2, 4, 8]), degree)),
        "trainer.nnodes": draw(st.one_of(st.integers(1, 64), degree)),
        "actor_rollout_ref.model.path": draw(
            st.sampled_from(
                [
                    "Qwen/Qwen2-7B-Instruct",
                    "Qwen/Qwen3-30B-A3B",
                    "moonshotai/Moonlight-16B-A3B",
                    "deepseek-ai/DeepSeek-V3",
                    "/nowhere/model",
                    "$MODEL_PATH",
                    "tiny",
                ]
            )
        ),
    }
    for k in list(ov):
        if k.startswith(A) and draw(st.booleans()):
            ov[k.replace(A, R)] = draw(st.one_of(small, degree))
    if draw(st.booleans()):
        ov[f"{A}.override_transformer_config.fp16"] = draw(st.sampled_from(["True", "False", "1"]))
    keys = draw(
        st.lists(
            st.sampled_from(
                [
                    "algorithm.group_size",
                    "kl_coeff",
                    "training.batch_size",
                    "+x.y",
                    f"+{A}.override_transformer_config.nope",
                    f"{A}.grad_offload",
                ]
            ),
            max_size=3,
        )
    )
    items = [f"{k}={v}" for k, v in ov.items()] + [f"{k}=1" for k in keys]
    return draw(st.permutations(items))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(launches(), st.sampled_from(["h100", "a100", "h20"]))
def test_random_degrees_give_only_coded_findings(items, hw):
    rep = diagnose_overrides(items, hardware=hw)
    for f in rep.findings:
        assert isinstance(f, Finding) and f.code in CODES and f.severity in ("error", "warning", "info")
        assert f.message
    # An oracle independent of diagnose: verl refuses a world size that TP x PP x CP does not divide, and a
    # mini-batch larger than the train batch. Such a launch must be reported as an error (exit code 1).
    ov = dict(i.split("=", 1) for i in items)
    tp, pp, cp = (_int(ov.get(f"{A}.{k}_parallel_size")) for k in ("tensor_model", "pipeline_model", "context"))
    gpn, nn = _int(ov.get("trainer.n_gpus_per_node")), _int(ov.get("trainer.nnodes"))
    tb, mini = _int(ov.get("data.train_batch_size")), _int(ov.get("actor_rollout_ref.actor.ppo_mini_batch_size"))
    bad_world = None not in (tp, pp, cp, gpn, nn) and (gpn * nn) % (tp * pp * cp) != 0
    bad_batch = None not in (tb, mini) and mini > tb
    if bad_world or bad_batch:
        assert rep.exit_code == 1, (items, [f.code for f in rep.findings])
        assert "INVALID_DEGREES" in rep.codes("error") if bad_world else "BATCH_DIVISIBILITY" in rep.codes("error")
    if rep.exit_code == 0:
        assert not [f for f in rep.findings if f.severity == "error"]
    rep.to_dict()  # serialisable summary


def _int(v: str | None) -> int | None:
    """A positive integer override value, else None (junk values are diagnose's to report)."""
    return int(v) if v is not None and v.isdigit() and int(v) > 0 else None


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("abc=.+-_$\\\"'{}[] \n#/12")), max_size=300))
def test_random_script_text_never_raises(text):
    overrides, findings, facts = parse_script("python3 -m verl.trainer.main_ppo " + text)
    rep = diagnose_overrides(overrides, findings=findings)
    assert all(f.code in CODES for f in rep.findings)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "A=(",
                "A+=(",
                "B=(",
                ")",
                '"${A[@]}"',
                "${A[*]}",
                '"${B[@]}"',
                "a.b=1",
                "x",
                "$A",
                "#c",
                "\\\n",
                "\n",
                " ",
                "'",
                '"',
                "(",
                "$((1+2))",
                "${A:-",
                "}",
                ";",
                "|",
            ]
        ),
        max_size=60,
    )
)
def test_random_array_scripts_give_words_or_a_coded_error(parts):
    """Arrays (``A=(...)``, ``+=``, ``"${A[@]}"``) in any arrangement: overrides and findings, or a coded error."""
    text = "#!/bin/bash\n" + "".join(parts) + "\npython3 -m verl.trainer.main_ppo " + "".join(reversed(parts)) + "\n"
    try:
        overrides, findings, facts = parse_script(text)
    except GrpoTuneError as exc:
        assert exc.code in CODES
        return
    rep = diagnose_overrides(overrides, findings=findings)
    assert all(f.code in CODES for f in rep.findings)


def test_best_yaml_is_diagnosed_without_errors(tmp_path):
    for name in ("7b-tp2", "moonlight-tp4-ep4-etp1", "qwen3-30b-a3b-ep8"):
        cfg = configs()[name]
        path = save(cfg, tmp_path / f"{name}.yaml")
        rep = diagnose_path(path)
        assert rep.kind == "run_config"
        s = cfg.strategy
        assert (
            rep.summary["roles"]["actor"]["tp"] == s.layout.tp
            and rep.summary["roles"]["rollout"]["tp"] == s.rollout.rollout_tp
        )
        degree_errors = rep.codes("error") - {"OOM_RISK"}
        assert not degree_errors, [f.to_dict() for f in rep.findings]
        # the exported script of the same plan reads the same
        (tmp_path / f"{name}.sh").write_text(verl_script(cfg))
        rep2 = diagnose_path(tmp_path / f"{name}.sh")
        assert rep2.summary["roles"] == rep.summary["roles"]


def test_best_yaml_that_fits_has_no_errors_at_all(tmp_path):
    cfg = make("qwen2-7b", 8, tp=2, rollout_tp=2, mbs=2, offload=("param", "optimizer"))
    rep = diagnose_path(save(cfg, tmp_path / "best.yaml"))
    assert rep.count("error") == 0, [f.to_dict() for f in rep.findings]
    assert rep.summary["memory"]["phases"]


def test_best_yaml_with_impossible_degrees_is_a_finding(tmp_path):
    import yaml

    cfg = configs()["7b-tp2"]
    data = cfg.to_dict()
    data["strategy"]["tp"] = 3  # does not divide 8 GPUs nor 28 heads
    data["strategy"]["dp"] = None
    p = tmp_path / "best.yaml"
    p.write_text(yaml.safe_dump(data))
    rep = diagnose_path(p)
    assert rep.codes("error") == {"INVALID_DEGREES"} and rep.exit_code == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([("Qwen/Qwen2-7B-Instruct", 28), ("Qwen/Qwen3-30B-A3B", 48), ("moonshotai/Moonlight-16B-A3B", 27)]),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2]),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 2]),
    st.booleans(),
    st.sampled_from([0.4, 0.6, 0.9]),
)
def test_plausible_degrees_reach_the_memory_model(model, tp, pp, nodes, ep, rtp, mbs, offload, gmu):
    path, _layers = model
    items = [
        f"actor_rollout_ref.model.path={path}",
        f"{A}.tensor_model_parallel_size={tp}",
        f"{A}.pipeline_model_parallel_size={pp}",
        f"{A}.expert_model_parallel_size={ep}",
        f"{A}.param_offload={offload}",
        f"{A}.optimizer_offload={offload}",
        f"{RO}.tensor_model_parallel_size={rtp}",
        f"{RO}.gpu_memory_utilization={gmu}",
        f"{RO}.name=vllm",
        f"{RO}.n=5",
        f"{RO}.log_prob_micro_batch_size_per_gpu={mbs}",
        "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={mbs}",
        "trainer.n_gpus_per_node=8",
        f"trainer.nnodes={nodes}",
    ]
    rep = diagnose_overrides(items)
    assert all(f.code in CODES for f in rep.findings)
    if not rep.has_errors:
        assert rep.summary["memory"] is not None
    for f in rep.findings:
        if f.code == "OOM_RISK" and f.severity == "error":
            assert f.phase and f.bytes > 0
