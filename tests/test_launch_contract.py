"""The launch contract: a tuned launch, run by bash with a recording stand-in for python3 on PATH, passes exactly
the original's arguments except the keys tune changed (their new values), the keys it was told to drop (gone) or
rename, and the keys it adds; it runs no other command. Checked over the shipped verl renditions and over random
scripts (continued quotes, escaped blanks, quote-balancing trailers, CRLF, mixed quoting); a script the rewriter
cannot reproduce exactly is refused with a code. The oracle is bash itself: what python3 received."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from grpo_tune.cli.main import main
from grpo_tune.core.errors import CODES, GrpoTuneError
from grpo_tune.frameworks.verl.launch import read_launch
from grpo_tune.frameworks.verl.script import tuned_text

ROOT = Path(__file__).resolve().parent.parent
BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")
SHIPPED = sorted((ROOT / "examples").glob("*.sh")) + sorted((ROOT / "examples/verl-upstream").glob("*.sh"))
TOKEN = re.compile(r"(\+{0,2}|~)?([A-Za-z_][A-Za-z0-9_.\-@/]*)=(.*)", re.DOTALL)
"""A Hydra override as python3 receives it (independent of the shell reader)."""
RO = "actor_rollout_ref.rollout"
A = "actor_rollout_ref.actor"
KEYS = [
    f"{RO}.gpu_memory_utilization",
    f"{RO}.n",
    f"{RO}.tensor_model_parallel_size",
    f"{A}.megatron.tensor_model_parallel_size",
    f"{A}.megatron.pipeline_model_parallel_size",
    f"{A}.ppo_micro_batch_size_per_gpu",
    "trainer.experiment_name",
    "trainer.total_epochs",
    "trainer.save_freq",
    "data.truncation",
]
BASE = {  # what read_launch needs to know the plan
    "actor_rollout_ref.model.path": "Qwen/Qwen2-7B-Instruct",
    "trainer.n_gpus_per_node": "8",
    "trainer.nnodes": "1",
    "data.train_batch_size": "64",
    f"{A}.ppo_mini_batch_size": "16",
    "data.max_prompt_length": "512",
    "data.max_response_length": "512",
}
DECLARED = {*KEYS, *BASE}
"""Keys verl declares (an added one is written without Hydra's `+`); trainer.val_before_train too."""
DECLARED.add("trainer.val_before_train")
EXAMPLES = int(os.environ.get("GRPO_TUNE_CONTRACT_EXAMPLES", "120"))
"""Random scripts per run (120 in the default suite; docs/reliability.md states a longer run's figures:
GRPO_TUNE_CONTRACT_EXAMPLES=2000 pytest tests/test_launch_contract.py --hypothesis-show-statistics)."""


# --- the recording stand-in for python3 -------------------------------------------------------------


def _fake_bin(tmp: Path) -> Path:
    b = tmp / "bin"
    b.mkdir(exist_ok=True)
    fake = b / "python3"
    fake.write_text('#!/bin/bash\nprintf \'%s\\0\' "$#" "$@" >> "$GT_REC"\n')
    fake.chmod(0o755)
    return b


def run_recorded(text: str, tmp: Path, tag: str) -> tuple[list[list[str]], set[str], int]:
    """Run ``text`` with bash in an empty folder, python3 a recorder: (each python3 argv, files made, exit code)."""
    work = tmp / f"cwd-{tag}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    script = tmp / f"{tag}.sh"
    script.write_bytes(text.encode())
    rec = tmp / f"{tag}.rec"
    rec.write_bytes(b"")
    env = {"PATH": f"{_fake_bin(tmp)}:/usr/bin:/bin", "HOME": str(tmp), "GT_REC": str(rec), "LC_ALL": "C"}
    r = subprocess.run([BASH, str(script)], cwd=work, env=env, capture_output=True, timeout=30, check=False)
    parts = rec.read_bytes().split(b"\0")[:-1]
    calls, i = [], 0
    while i < len(parts):
        n = int(parts[i])
        calls.append([p.decode() for p in parts[i + 1 : i + 1 + n]])
        i += 1 + n
    return calls, {p.name for p in work.iterdir()}, r.returncode


def _fmt(v: object) -> str:
    return "null" if v is None else ("True" if v is True else "False" if v is False else str(v))


def expected_argv(
    argv: list[str], changes: dict[str, object], drops: set[str], renames: dict[str, str], runtime: set[str]
) -> list[str]:
    """The original argv with the contract applied, the keys tune adds left out (checked apart: where they go
    among the overrides does not change what Hydra composes)."""
    out = []
    for a in argv:
        m = TOKEN.fullmatch(a)
        if not m or m.group(1) == "~" or "." not in m.group(2):
            out.append(a)
            continue
        prefix, key, val = m.groups()
        if key in drops:
            continue
        if key in renames:
            prefix, key = "", renames[key]
        if key in changes and key not in runtime:
            val = _fmt(changes[key])
        out.append(f"{prefix}{key}={val}")
    return out


def _split_added(argv: list[str], added_keys: list[str]) -> tuple[list[str], list[str]]:
    keep, added = [], []
    for a in argv:
        m = TOKEN.fullmatch(a)
        (added if m and m.group(2) in added_keys else keep).append(a)
    return keep, added


def check_contract(text: str, tmp: Path, changes: dict, drops: set[str], renames: dict[str, str], runtime: set[str]):
    """tuned_text on ``text``: refused with a code, or bash runs the contract. Returns "ran" or "refused"."""
    path = tmp / "launch.sh"
    path.write_bytes(text.encode())
    try:
        launch = read_launch(path)
    except GrpoTuneError as exc:
        assert exc.code in CODES
        return "unread"
    fixes = {k: None for k in drops} | {k: ("", v) for k, v in renames.items()}
    pairs = {k: (launch.get(k), v) for k, v in changes.items()}
    try:
        out = tuned_text(launch, pairs, fixes)
    except GrpoTuneError as exc:
        assert exc.code == "BAD_CONFIG", exc
        return "refused"
    assert ("\r\n" in out) == ("\r\n" in text)  # line endings kept
    before, files0, rc0 = run_recorded(text, tmp, "orig")
    after, files1, rc1 = run_recorded(out, tmp, "tuned")
    assert (rc1, files1) == (rc0, files0), out  # no other command ran (a `touch` would leave a file)
    assert len(after) == len(before), out  # python3 ran as often
    present = {m.group(2) for call in before for a in call if (m := TOKEN.fullmatch(a))}
    present = {renames.get(k, k) for k in present - drops}
    added_keys = [k for k in changes if k not in present]
    for i, (b, a) in enumerate(zip(before, after)):
        keep, added = _split_added(a, added_keys)
        assert keep == expected_argv(b, changes, drops, renames, runtime), (text, out)
        want = [f"{'+' if k not in DECLARED else ''}{k}={_fmt(changes[k])}" for k in added_keys]
        assert sorted(added) == (sorted(want) if i == len(before) - 1 else []), (text, out)
    return "ran"


# --- random scripts ---------------------------------------------------------------------------------

_SAFE = st.sampled_from(["1", "2", "8", "0.5", "True", "grpo", "x_y", "a-b", "v1.2"])
_SPACED = st.sampled_from(["a b", "it's", 'say "hi"', "x  y", "#not a comment", "a\\b"])


def _dq(s: str) -> str:
    return '"' + re.sub(r'(["\\$`])', r"\\\1", s) + '"'


def _sq(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def _esc(s: str) -> str:
    return re.sub(r"([^A-Za-z0-9_.=+\-/])", r"\\\1", s)


@st.composite
def _word(draw, key: str, value: str):
    """``key=value`` spelled in one of bash's ways (every one passes the same argument)."""
    tok = f"{key}={value}"
    style = draw(st.integers(0, 8))
    if style == 0:
        return _esc(tok)
    if style == 1:
        return _sq(tok)
    if style == 2:
        return _dq(tok)
    if style == 3:
        return f"{key}={_dq(value)}" if draw(st.booleans()) else f"{key}={_sq(value)}"
    if style == 4:  # a double quote continued over two lines inside its quotes
        q = _dq(tok)
        cut = draw(st.integers(1, len(q) - 1))
        if q[cut - 1] == "\\":
            cut -= 1
        return q[:cut] + "\\\n" + q[cut:]
    if style == 5:  # an unquoted word continued mid-word
        e = _esc(tok)
        cut = draw(st.integers(1, len(e)))
        if e[cut - 1] == "\\":
            cut -= 1
        return e[:cut] + "\\\n" + e[cut:]
    if style == 6:  # mixed quoting
        k1, k2 = key.split(".", 1)
        return f'"{k1}".{_sq(k2)}={_esc(value)}'
    if style == 7:  # a continued double quote and a trailer that balances quotes elsewhere
        return _dq(tok)[:-1] + '\\\n"'
    return _esc(tok)


@st.composite
def scripts(draw):
    keys = draw(st.lists(st.sampled_from(KEYS), unique=True, min_size=1, max_size=6))
    words, runtime = [], set()
    items = list(BASE.items()) + [
        (
            k,
            draw(_SPACED)
            if k in ("trainer.experiment_name", "data.truncation") and draw(st.booleans())
            else draw(_SAFE),
        )
        for k in keys
    ]
    items = draw(st.permutations(items))
    for k, v in items:
        if k in KEYS and draw(st.integers(0, 9)) == 0:
            words.append(f'{k}="$X"')
            runtime.add(k)
        else:
            words.append(draw(_word(k, v)))
    if draw(st.booleans()):  # an argument that opens a quote bash balances only with the trailer
        words.insert(draw(st.integers(0, len(words))), "'trainer.project_name=x\" || touch PWNED_p; : \"'")
    if draw(st.booleans()):  # a dropped key with an escaped blank that holds another override
        words.insert(draw(st.integers(0, len(words))), f"{A}.no_such_key=a\\ trainer.total_epochs=1")
    sep = draw(st.sampled_from([" \\\n    ", " ", " \\\n\t"]))
    trailer = draw(st.sampled_from(["", ' "$@"', ' "$@" # "', " # '\"", " || true", "; true", ' "$@" | cat']))
    text = (
        '#!/bin/bash\nset -u\nX=${X:-7}\n# a comment with an odd quote: "\n'
        "python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer" + sep + sep.join(words) + trailer + "\n"
    )
    if draw(st.integers(0, 9)) == 0:
        text = text.replace("\n", "\r\n")
    return text, keys, runtime


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=scripts(), pick=st.data())
def test_random_scripts_keep_the_launch_contract(tmp_path, data, pick):
    text, keys, runtime = data
    present = keys + ([f"{A}.no_such_key"] if "no_such_key" in text else [])
    changes = pick.draw(
        st.dictionaries(st.sampled_from(KEYS + ["trainer.val_before_train"]), st.sampled_from([1, 4, 0.3, True, "z"]))
    )
    drops = set(pick.draw(st.lists(st.sampled_from(present), max_size=2))) - set(changes)
    if "no_such_key" in text:
        drops.add(f"{A}.no_such_key")
    how = check_contract(text, tmp_path, changes, drops, {}, runtime)
    if "\r\n" in text:
        assert how == "unread"  # CRLF: bash would not run it as written; refused, coded, as diagnose refuses it
    else:
        assert how != "unread", text
    event(f"outcome: {how}")
    # the rewriter reproduces every one of these scripts: a refusal here is a rewrite that lost a case
    assert how in ("ran", "unread"), text


@settings(
    max_examples=max(60, EXAMPLES // 2), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    launch=st.sampled_from(SHIPPED),
    changes=st.dictionaries(st.sampled_from(KEYS + ["trainer.val_before_train"]), st.sampled_from([1, 2, 0.45, "z"])),
    drop=st.lists(st.sampled_from(KEYS), max_size=2),
)
def test_shipped_launches_keep_the_launch_contract(tmp_path, launch, changes, drop):
    text = launch.read_text()
    runtime = {k for k in KEYS if re.search(re.escape(k) + r"=\S*[$`]", text)}
    assert check_contract(text, tmp_path, changes, set(drop) - set(changes), {}, runtime) == "ran"
    event(f"launch: {launch.name}")


def test_a_rename_keeps_the_value_as_written(tmp_path):
    text = (
        "#!/bin/bash\nX=3\npython3 -m verl.trainer.main_ppo \\\n"
        + " \\\n".join(f"  {k}={v}" for k, v in BASE.items())
        + ' \\\n  "algorithm.group_size=$X" \\\n  "trainer.experiment_name=a\\\nb"\n'
    )
    renamed = {"algorithm.group_size": f"{RO}.n"}
    assert check_contract(text, tmp_path, {f"{RO}.n": 4}, set(), renamed, {f"{RO}.n"}) == "ran"  # $X: as written


# --- the two reproductions of issue 39, through `grpo-tune tune` ------------------------------------------


def _upstream_with(tmp_path: Path, old: str, new: str, *, trailer: str = "") -> Path:
    src = (ROOT / "examples/verl-upstream/qwen2-7b-math-megatron.sh").read_text()
    assert old in src
    text = src.replace(old, new)
    if trailer:
        text = text.replace('trainer.total_epochs=15 "$@"', 'trainer.total_epochs=15 "$@"' + trailer)
    p = tmp_path / "launch.sh"
    p.write_text(text)
    return p


def _tuned(capsys, launch: Path, out: Path, *extra: str) -> tuple[dict, str]:
    rc = main(["tune", str(launch), "--out", str(out), "--json", *extra])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    doc = json.loads(cap.out)
    return doc, Path(doc["files"]["tuned.sh"]).read_bytes().decode()  # no newline translation


def test_a_continued_double_quote_with_a_quote_balancing_trailer_runs_no_touch(tmp_path, capsys):
    """`"...gpu_memory_utilization=0\\` / `.6" \\` was rewritten on its first line only: the tuned.sh ran the
    `touch PWNED_x` that a single-quoted override and a `# "` trailer had kept inert."""
    p = _upstream_with(
        tmp_path,
        f"    {RO}.gpu_memory_utilization=0.6 \\\n",
        f'    "{RO}.gpu_memory_utilization=0\\\n.6" \\\n',
        trailer=' # "',
    )
    text = p.read_text().replace(
        "trainer.experiment_name=qwen2_7b_megatron", "'trainer.experiment_name=x\" || touch PWNED_x; : \"'"
    )
    p.write_text(text)
    doc, tuned = _tuned(capsys, p, tmp_path / "runs")
    assert f"{RO}.gpu_memory_utilization" in doc["overrides"]  # the continued word is one tune changes
    changes = {k: v["new"] for k, v in doc["overrides"].items()}
    before, files0, rc0 = run_recorded(text, tmp_path, "o")
    after, files1, rc1 = run_recorded(tuned, tmp_path, "t")
    assert "PWNED_x" not in files1 and files1 == files0 and rc1 == rc0 == 0
    keep, added = _split_added(after[0], [k for k in changes if f"{k}=" not in text])
    assert keep == expected_argv(before[0], changes, set(), {}, set())
    assert len(after[0]) == len(before[0]) + len(added) and len(before[0]) > 35  # no override fell out


def test_an_escaped_blank_in_a_dropped_key_never_becomes_a_live_override(tmp_path, capsys):
    """`...no_such_key=a\\ trainer.total_epochs=1` under --ignore-unknown left `trainer.total_epochs=1` as an
    argument of its own in tuned.sh, overriding the user's 15."""
    bad = f"{A}.no_such_key=a\\ trainer.total_epochs=1"
    p = _upstream_with(tmp_path, "    trainer.save_freq=20 \\\n", f"    {bad} \\\n    trainer.save_freq=20 \\\n")
    doc, tuned = _tuned(capsys, p, tmp_path / "runs", "--ignore-unknown")
    changes = {k: v["new"] for k, v in doc["overrides"].items()}
    before, _, _ = run_recorded(p.read_text(), tmp_path, "o")
    after, _, _ = run_recorded(tuned, tmp_path, "t")
    assert "trainer.total_epochs=1" not in after[0] and "trainer.total_epochs=15" in after[0]
    # a key the launch does not set and the tuned plan does (selective recompute at the prices since verl's batch
    # moves are priced) is appended: the rest is the launch's argv with the changes in place
    keep, _ = _split_added(after[0], [k for k in changes if f"{k}=" not in p.read_text()])
    assert keep == expected_argv(before[0], changes, {f"{A}.no_such_key"}, {}, set())


def test_a_crlf_script_is_refused_and_a_crlf_override_list_keeps_its_line_endings(tmp_path, capsys):
    src = (ROOT / "examples/verl-upstream/qwen2-7b-math-megatron.sh").read_text()
    p = tmp_path / "crlf.sh"
    p.write_bytes(src.replace("\n", "\r\n").encode())
    assert main(["tune", str(p), "--no-emit"]) == 2
    err = capsys.readouterr().err
    assert "[BAD_CONFIG]" in err and "CRLF" in err
    lst = tmp_path / "launch.overrides"
    lst.write_bytes("".join(f"{k}={v}\r\n" for k, v in BASE.items()).encode())
    doc, tuned = _tuned(capsys, lst, tmp_path / "runs")
    assert tuned.count("\r\n") == tuned.count("\n") == len(BASE) + len(set(doc["overrides"]) - set(BASE))


def test_a_launch_the_rewriter_cannot_reproduce_is_refused_coded(tmp_path):
    """An array element passed to verl and to another command: rewriting it would change the other command."""
    text = (
        "#!/bin/bash\nARGS=(trainer.nnodes=1 "
        + " ".join(f"{k}={v}" for k, v in BASE.items() if k != "trainer.nnodes")
        + ')\necho "${ARGS[@]}" > /dev/null\npython3 -m verl.trainer.main_ppo "${ARGS[@]}"\n'
    )
    p = tmp_path / "arr.sh"
    p.write_text(text)
    launch = read_launch(p)
    with pytest.raises(GrpoTuneError) as exc:
        tuned_text(launch, {"data.train_batch_size": (64, 128)})
    assert exc.value.code == "BAD_CONFIG" and "exactly" in str(exc.value)
