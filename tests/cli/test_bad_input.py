"""Every bad input gets one line and changes nothing: a table of inputs a new user typed,
each through the CLI's real entry point (``autotune.cli.main``, in this process: the
table is long and each case would otherwise pay a process start and imports).

Each case asserts: exit code 2, exactly one line on stderr, starting ``autotune: error:``,
naming the flag (or file) and containing the expected words, no traceback, and no file
created in the working folder (no ``trials/``, no database).
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.cli._app import main
from autotune.study.storage import StudyConfig, store_start

LATIN1 = "precision: [fp32]\n# caf\xe9\n".encode("latin-1")

FILES: dict[str, str | bytes] = {
    "bad_key.yaml": "precision: [fp32]\ncolour: [red]\nmicro_batch_size: [1]\n",
    "fp8.yaml": "precision: [fp32, fp8]\nmicro_batch_size: [1]\n",
    "param_z2.yaml": "zero_stage: [2]\noffload_param: [cpu]\nmicro_batch_size: [1]\n",
    "nvme.yaml": "offload_optimizer: [nvme]\nmicro_batch_size: [1]\n",
    "scalar.yaml": "precision: fp32\n",
    "latin1.yaml": LATIN1,
    "not_json.json": "optimizer: {type: Adam}\n",
    "list.json": "[1, 2]",
    "batch32.json": '{"train_batch_size": 32}',
    "fp16_true.json": '{"fp16": true}',
    "zero3.json": '{"zero_optimization": 3}',
    "offload_str.json": '{"zero_optimization": {"offload_optimizer": "cpu"}}',
    "stage2.json": '{"zero_optimization": {"stage": 2}}',
    "auto_lr.json": '{"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}',
    "latin1.json": b'{"x": "caf\xe9"}',
    "broken.py": "x = 1 / 0\n",
    "noattr.py": "x = 1\n",
    "notwl.py": "def make():\n    return 3\n",
    "raises.py": "def make():\n    raise ValueError('no GPUs here')\n",
    "nobatch.py": (
        "from autotune.workloads import CausalLMWorkload\n"
        "class NoBatch:\n"
        "    name = 'nobatch'\n    tokens_per_sample = 1\n"
        "    def build_model(self): ...\n    def make_batch(self, m, d): ...\n"
        "    def loss(self, m, b): ...\n"
        "def make():\n    return NoBatch()\n"
    ),
    "buildfail.py": (
        "from autotune.workloads import Workload\n"
        "class Fails(Workload):\n"
        "    name = 'fails'\n    tokens_per_sample = 1\n    default_global_batch = 8\n"
        "    def build_model(self):\n        raise RuntimeError('weights.bin not found')\n"
        "    def make_batch(self, m, d): ...\n"
        "def make():\n    return Fails()\n"
    ),
}

RUN = ["run", "--workload", "gpt-tiny", "--gpus", "2"]

# (arguments, words the one line must hold); each line must also name its flag or file.
CASES: list[tuple[list[str], str]] = [
    # durations
    ([*RUN, "--budget", "2x"], "--budget: cannot read duration '2x'"),
    ([*RUN, "--budget", "0s"], "--budget: duration '0s' is zero"),
    ([*RUN, "--budget", "1m1h"], "--budget: duration '1m1h' repeats or misorders"),
    ([*RUN, "--budget", "99999999999999999h"], "--budget 99999999999999999h: more than"),
    ([*RUN, "--probe-timeout", "soon"], "--probe-timeout: cannot read duration 'soon'"),
    # sizes
    ([*RUN, "--vram", "lots"], "--vram: cannot read size 'lots'"),
    ([*RUN, "--vram", "0GiB"], "--vram: size '0GiB' is zero"),
    ([*RUN, "--host-ram", "lots"], "--host-ram: cannot read size 'lots'"),
    # counts
    ([*RUN[:3], "--gpus", "0"], "--gpus 0: 0 is not a positive count or an increasing range"),
    ([*RUN[:3], "--gpus", "two"], "--gpus two: give a number of GPUs (8), a range (1-8) or"),
    ([*RUN[:3], "--gpus", "1-2", "--gpus-per-trial", "1"], "a searched world size is each"),
    ([*RUN[:3], "--gpus", "1-5"], "--gpus 5: no CUDA GPU here, and 5 CPU ranks would"),
    ([*RUN[:3], "--gpus", "64"], "--gpus 64: no CUDA GPU here"),
    ([*RUN, "--gpus-per-trial", "3"], "--gpus-per-trial 3 exceeds --gpus 2"),
    ([*RUN, "--gpus-per-trial", "0"], "--gpus-per-trial: input should be greater than 0"),
    ([*RUN, "--global-batch", "0"], "--global-batch 0: give a positive integer or 'auto'"),
    ([*RUN, "--global-batch", "-4"], "--global-batch -4: give a positive integer or 'auto'"),
    ([*RUN, "--global-batch", "lots"], "--global-batch lots: give a positive integer"),
    ([*RUN, "--global-batch", "auto"], "--global-batch auto needs --max-global-batch N"),
    ([*RUN, "--max-global-batch", "0"], "--max-global-batch: input should be greater than 0"),
    ([*RUN, "--timed-steps", "0"], "--timed-steps: input should be greater than 0"),
    ([*RUN, "--warmup-steps", "0"], "--warmup-steps: input should be greater than 0"),
    ([*RUN, "--max-trials", "0"], "--max-trials: input should be greater than 0"),
    (
        [*RUN, "--timed-steps", "50", "--max-timed-steps", "2"],
        "--max-timed-steps 2 is below --timed-steps 50",
    ),
    ([*RUN, "--memory-margin", "1.5"], "--memory-margin: input should be less than 1"),
    ([*RUN, "--memory-margin", "-0.1"], "--memory-margin: input should be greater than"),
    ([*RUN, "--seed", "x"], "Invalid value for '--seed'"),
    # choices
    ([*RUN, "--executor", "slurm"], "--executor: input should be 'ray' or 'local'"),
    ([*RUN, "--sampler", "bayes"], "--sampler: input should be"),
    ([*RUN, "--inject-fault", "boom"], "--inject-fault: input should be"),
    ([*RUN, "--colour", "red"], "No such option: --colour"),
    ([*RUN, "--ray-address", "head"], "--ray-address 'head': give auto, HOST:PORT"),
    ([*RUN, "--ray-address", "auto", "--executor", "local"], "--ray-address auto with"),
    (["frobnicate"], "No such command 'frobnicate'"),
    # workloads
    (["run"], "--workload or --script is required"),
    (["run", "--workload", "gpt-huge"], "unknown workload 'gpt-huge'; known: gpt-tiny"),
    ([*RUN, "--objective", "cost"], "--objective cost needs --gpu-hour-price USD"),
    ([*RUN, "--objective", "cheapest"], "--objective cheapest: choose one of"),
    ([*RUN, "--objective", "deadline", "--deadline", "3d"], "needs --train-tokens N or --train-s"),
    ([*RUN, "--train-samples", "many"], "--train-samples: cannot read 'many'"),
    ([*RUN, "--train-samples", "1M", "--train-tokens", "1B"], "give one size of the training"),
    ([*RUN, "--deadline", "3d"], "--deadline with --objective throughput"),
    ([*RUN, "--gpu-hour-price", "0"], "--gpu-hour-price: input should be greater than 0"),
    (["run", "--workload", "no_such_file.py:make"], "file no_such_file.py does not exist"),
    (["run", "--workload", "broken.py:make"], "importing broken.py failed with ZeroDivisionError"),
    (["run", "--workload", "noattr.py:missing"], "has no function 'missing'"),
    (["run", "--workload", "notwl.py:make"], "returned int, not a Workload"),
    (["run", "--workload", "raises.py:make"], "calling make() raised ValueError: no GPUs here"),
    (["run", "--workload", "nobatch.py:make"], "default_global_batch"),
    (["run", "--workload", "buildfail.py:make"], "build_model() failed"),
    # scripts
    (["run", "--script", "missing.py"], "--script missing.py: no such file"),
    (["run", "--script", "noattr.py", "--train-tokens", "1B"], "give --train-samples (tokens"),
    (["run", "--script", "noattr.py", "--script-arg", "batch=--bs"], "--script-arg batch=--bs"),
    (["run", "--script", "noattr.py", "--", "--num_gpus", "2"], "--num_gpus is a launcher flag"),
    (["run", "--workload", "gpt-tiny", "--", "--lr", "1"], "script arguments (--lr 1) without"),
    ([*RUN, "--verify", "--ray-address", "auto"], "--verify: the loss check runs on this"),
    ([*RUN, "--verify", "strict", "--ray-address", "auto"], "--verify strict: the loss check"),
    ([*RUN, "--verify=sometimes"], "--verify: input should be 'off', 'on' or 'strict', got"),
    ([*RUN, "--verify-strict", "--ray-address", "auto"], "--verify strict: the loss check"),
    # studies
    (["run", "--study", "nosuch"], "--study nosuch: no such study in"),
    ([*RUN, "--study", "../x"], "--study: study name '../x' must be"),
    ([*RUN, "--study", "/abs"], "--study: study name '/abs' must be"),
    ([*RUN, "--study", "a b"], "--study: study name 'a b' must be"),
    ([*RUN, "--study", "x\ntouch INJECTED"], "--study: study name"),
    # spaces
    ([*RUN, "--space", "missing.yaml"], "--space missing.yaml: no such file"),
    ([*RUN, "--space", "bad_key.yaml"], "bad_key.yaml:2: unknown key 'colour'; allowed keys:"),
    ([*RUN, "--space", "fp8.yaml"], "fp8.yaml:1: precision[1]: Input should be 'fp32'"),
    ([*RUN, "--space", "param_z2.yaml"], "offload_param 'cpu' needs zero_stage 3"),
    ([*RUN, "--space", "nvme.yaml"], "offload_optimizer lists only 'nvme', but it needs"),
    ([*RUN, "--space", "scalar.yaml"], "scalar.yaml"),
    ([*RUN, "--space", "latin1.yaml"], "latin1.yaml: not UTF-8 text"),
    # base configs
    ([*RUN, "--base-config", "missing.json"], "--base-config missing.json: cannot read it"),
    ([*RUN, "--base-config", "not_json.json"], "--base-config not_json.json: not valid JSON"),
    ([*RUN, "--base-config", "list.json"], "--base-config list.json: a DeepSpeed config is a"),
    (
        [*RUN, "--base-config", "batch32.json", "--global-batch", "16"],
        "pins train_batch_size = 32 but --global-batch is 16",
    ),
    ([*RUN, "--base-config", "fp16_true.json"], "'fp16' must be an object"),
    ([*RUN, "--base-config", "zero3.json"], "'zero_optimization' must be an object"),
    ([*RUN, "--base-config", "offload_str.json"], "zero_optimization.offload_optimizer must be"),
    ([*RUN, "--base-config", "stage2.json"], "pins zero_optimization.stage = 2"),
    ([*RUN, "--base-config", "auto_lr.json"], 'leaves optimizer.params.lr as "auto"'),
    ([*RUN, "--base-config", "latin1.json"], "--base-config latin1.json: not UTF-8 text"),
    ([*RUN, "--nvme-path", "no/such/dir"], "--nvme-path no/such/dir: not a writable folder"),
    # storage
    (
        [*RUN, "--storage", "postgresql+psycopg2://u:secret@127.0.0.1:9/db"],
        "--storage postgresql+psycopg2://u:***@127.0.0.1:9/db: cannot open",
    ),
    ([*RUN, "--storage", "notaurl"], "--storage notaurl: cannot open"),
    # checked before anything is written or measured: no trials/ beside the error
    ([*RUN, "--storage", "sqlite:////proc/x/y.db"], "cannot open the SQLite file /proc/x/y.db"),
    ([*RUN, "--trials-dir", "/proc/t"], "--trials-dir /proc/t: cannot write there"),
    (["status", "--storage", "sqlite:///nowhere/x.db", "--study", "s"], "no such study"),
    (["export", "-o", "out", "--storage", "sqlite:///x.db", "--study", "s"], "no such study"),
    (["status", "--storage", "sqlite:///bad.db", "--study", "bad"], "its stored settings"),
    (["export", "-o", "out", "--storage", "sqlite:///bad.db", "--study", "bad"], "stored"),
    (["verify", "--storage", "sqlite:///nowhere/x.db", "--study", "s"], "no such study"),
    (["verify", "--storage", "sqlite:///bad.db", "--study", "nosuch"], "--study nosuch: no such"),
    (["verify", "--storage", "sqlite:///bad.db", "--study", "bad"], "its stored settings"),
    (["verify", "--storage", "sqlite:///bad.db", "--study", "new"], "no feasible measured trial"),
    (["verify", "--storage", "sqlite:///bad.db", "--study", "new", "--trial", "3"], "--trial 3:"),
    (["verify", "--storage", "sqlite:///bad.db", "--steps", "0"], "'--steps'"),
    # plan and space
    (["plan", "--workload", "gpt-tiny", "--gpus", "2", "--vram", "2x"], "--vram: cannot read"),
    (["plan", "--workload", "nope", "--gpus", "1", "--vram", "8GiB"], "unknown workload 'nope'"),
    (["plan", "--workload", "gpt-tiny", "--gpus", "0", "--vram", "8GiB"], "--gpus 0: 0 is not"),
    (["plan", "--workload", "gpt-tiny", "--gpus", "1-2", "--vram", "8GiB"], "takes one number"),
    (
        ["plan", "--workload", "gpt-tiny", "--gpus", "1", "--vram", "8GiB", "--global-batch", "-4"],
        "'--global-batch'",
    ),
    (
        ["plan", "--workload", "gpt-tiny", "--gpus", "1", "--vram", "8GiB", "--memory-margin", "5"],
        "'--memory-margin'",
    ),
    (
        ["plan", "--workload", "gpt-tiny", "--gpus", "1", "--vram", "8GiB", "--host-ram", "x"],
        "--host-ram: cannot read size",
    ),
    (["plan", "--gpus", "1", "--vram", "8GiB"], "plan: give --workload W (the memory"),
    # plan --study: a study's configurations at other world sizes
    (["plan", "--storage", "sqlite:///bad.db", "--study", "new"], "has no measured probe yet"),
    (["plan", "--study", "s", "--gpus", "2-1"], "--gpus 2-1: 2-1 is not a positive count"),
    (["plan", "--study", "s", "--gpus", "two"], "--gpus two: give a number of GPUs (8)"),
    (["plan", "--study", "s", "--objective", "fastest"], "--objective fastest: choose one of"),
    (["plan", "--study", "s", "--objective", "deadline", "--train-tokens", "1B"], "needs --deadl"),
    (["plan", "--study", "s", "--objective", "deadline", "--deadline", "3d"], "needs --train-"),
    (["plan", "--study", "s", "--train-tokens", "lots"], "--train-tokens: cannot read 'lots'"),
    (["plan", "--study", "s", "--deadline", "3d"], "--deadline with --objective throughput"),
    (["plan", "--study", "s", "--objective", "deadline", "--deadline", "3x"], "--deadline: cannot"),
    (
        ["plan", "--study", "s", "--gpu-hour-price", "-1"],
        "--gpu-hour-price: input should be greater",
    ),
    (["space", "--space", "fp8.yaml"], "fp8.yaml:1: precision[1]"),
    (["space", "--gpus", "0"], "'--gpus'"),
    (["space", "--examples", "-1"], "'--examples'"),
    (["space", "--global-batch", "lots"], "--global-batch lots: give a positive integer"),
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bad-input")
    for name, content in FILES.items():
        target = path / name
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    # a study whose stored settings are not autotune's (edited by hand, another version)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(study_name="bad", storage=f"sqlite:///{path}/bad.db")
    study.set_user_attr("autotune_config", {"workload": 3})
    # an autotune study with no trial yet: nothing to verify
    new = optuna.create_study(study_name="new", storage=f"sqlite:///{path}/bad.db")
    store_start(new, StudyConfig(
        workload="gpt-tiny", space={}, accelerator="cpu", gpus_per_trial=2, global_batch=8,
        vram_limit_bytes=2**30,
    ), {})  # fmt: skip
    return path


def _files(folder: Path) -> set[str]:
    """What the folder holds (an existing database's SQLite -wal/-shm companions aside, and
    the bytecode Python keeps of a workload module it imported there)."""
    return {
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if not p.name.endswith(("-wal", "-shm")) and "__pycache__" not in p.parts
    }


@pytest.mark.parametrize(
    ("args", "words"), CASES, ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else ""
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    args: list[str],
    words: str,
    workdir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("COLUMNS", "250")
    before = _files(workdir)
    code = main(args)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, out + err
    assert len(lines) == 1, err
    assert lines[0].startswith("autotune: error: "), err
    assert words in lines[0], lines[0]
    assert "Traceback" not in out + err
    assert _files(workdir) == before, f"files created: {_files(workdir) - before}"


def test_the_table_covers_every_run_flag() -> None:
    """A new flag gets a bad-input case (or says here why it has none)."""
    from autotune.cli._flags import RunFlags

    free_form = {"study", "trials_dir", "quiet", "no_prune", "no_confirm", "no_early_stop"}
    free_form |= {"cold_probes", "seed", "tf32", "script_args", "retry_failed", "shared"}
    covered = {a[2:].replace("-", "_") for args, _ in CASES for a in args if a.startswith("--")}
    missing = set(RunFlags.model_fields) - covered - free_form
    assert missing == set()


def test_debug_shows_the_traceback(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.errors import SettingsError

    monkeypatch.chdir(workdir)
    with pytest.raises(SettingsError):
        main(["--debug", *RUN, "--budget", "2x"])


def test_storage_passwords_never_print(workdir: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(workdir)
    main([*RUN, "--storage", "postgresql+psycopg2://user:hunter2@127.0.0.1:9/db"])
    out, err = capsys.readouterr()
    assert "hunter2" not in out + err and "user:***@" in err
