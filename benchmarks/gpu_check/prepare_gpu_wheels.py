"""Prepare the wheels the GPU check carries to an offline GPU node (at most 64 MiB).

    python benchmarks/gpu_check/prepare_gpu_wheels.py .gpu-wheels   # here, where PyPI answers
    benchmarks/gpu_check/gpu_check.sh OUT --wheels .gpu-wheels      # there

The node is expected to run Python 3.12 on x86-64 Linux with torch, transformers, rich,
typer and the other packages of its image installed (NODE_HAS, from its ``pip list``), and
none of deepspeed, optuna, sqlalchemy, alembic, pydantic, accelerate or ray. This downloads
what autotune and the check's scripts need beyond that, at the versions installed in the
environment that runs this script (the ones the tests here ran with): binary wheels for
CPython 3.12 manylinux x86-64 and pure Python ones (``pip download --no-deps
--only-binary=:all: --python-version 3.12 ...``), and follows each wheel's own
requirements (for that interpreter and platform) to the packages
the node lacks. DeepSpeed publishes a source archive only: it is built into a pure-Python
wheel here (its ops are compiled on the node, just in time). Ray stays out (the check runs
``--executor local``); torch and NVIDIA's libraries are the node's.

``--libaio`` adds libaio's Debian packages (``apt-get download``) under ``deb/``: the check
unpacks them into a private prefix where the node lacks libaio, so that DeepSpeed's async
I/O op, and with it NVMe offload, builds there.

The folder is ignored by git (.gitignore) and named in the device run's ``carry``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

LIMIT_BYTES = 64 * 2**20
PYTHON = "3.12"
# What autotune imports beyond the node's image, what a DiT workload needs (diffusers), and
# what the check's Hugging Face Trainer script needs (accelerate: the Trainer requires it).
ROOTS = (
    "accelerate",
    "deepspeed",
    "optuna",
    "optuna-dashboard",
    "sqlalchemy",
    "alembic",
    "pydantic",
    "diffusers",
)
# Carried even where the node may have them: pydantic-core pins a recent typing-extensions.
ALWAYS = ("typing-extensions",)
# Never carried: too large for the limit, or the node's own build must be used.
NEVER = ("torch", "ray", "triton")
NEVER_PREFIXES = ("nvidia-", "cuda-")
# The GPU node's image, from its `pip list` (names normalised): not carried.
NODE_IMAGE = """
    absl-py aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
    hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
    jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
    linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl
    meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
    narwhals networkx ninja numba numba-cuda numpy numpyro onnx onnx-ir onnxruntime onnxscript
    opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
    packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
    propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
    pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
    pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu
    safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
    sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels
    sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
    tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
    torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect
    urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
    nvidia-ml-py"""
NODE_HAS = set(NODE_IMAGE.split())
# pip matches manylinux tags exactly: every glibc from 2.17 up to the node's (2.39) is fine
PLATFORMS = [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    *(f"manylinux_2_{minor}_x86_64" for minor in range(17, 40)),
]
# the node's interpreter, for the markers of each wheel's requirements
MARKER_ENV = {
    "python_version": PYTHON,
    "python_full_version": f"{PYTHON}.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(name: str) -> str:
    """``name==version`` as installed here (what the tests ran with), else ``name``."""
    try:
        return f"{name}=={version(name)}"
    except PackageNotFoundError:
        return name


def download(name: str, out: Path) -> Path:
    """The wheel of ``name`` for the node, downloaded (or built, for a source-only one)."""
    spec = pinned(name)
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q"]
    argv += ["--python-version", PYTHON, "--implementation", "cp"]
    argv += ["--abi", "cp312", "--abi", "abi3", "--abi", "none"]
    for platform in PLATFORMS:
        argv += ["--platform", platform]
    done = subprocess.run([*argv, "-d", str(out), spec], capture_output=True, text=True)
    if done.returncode:
        # DeepSpeed ships a source archive only: a pure-Python wheel built here (its ops
        # compile on the node, just in time)
        build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), spec]
        built = subprocess.run(build, capture_output=True, text=True)
        if built.returncode:
            raise SystemExit(f"{spec}: no wheel for the node\n{done.stderr}\n{built.stderr}")
    wanted = spec.partition("==")[2]
    match = [
        p
        for p in sorted(out.glob("*.whl"))
        if normalise(p.name.split("-")[0]) == normalise(name)
        and (not wanted or p.name.split("-")[1] == wanted)
    ]
    if not match:
        raise SystemExit(f"{spec}: pip saved no wheel of it in {out}")
    wheel = match[-1]
    if not any(tag in wheel.name for tag in ("-none-any", "-cp312-", "-abi3-")):
        raise SystemExit(f"{wheel.name} does not install on CPython {PYTHON}")
    return wheel


def requirements(wheel: Path) -> list[str]:
    """The names ``wheel`` requires on the node's interpreter and platform (no extras)."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(metadata).decode()
    names = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.split(":", 1)[1].strip())
        if requirement.marker is None or requirement.marker.evaluate(MARKER_ENV):
            names.append(requirement.name)
    return names


def carried(name: str) -> bool:
    key = normalise(name)
    if key in NEVER or key.startswith(NEVER_PREFIXES):
        return False
    return key in ALWAYS or key not in NODE_HAS


def libaio_debs(out: Path) -> list[Path]:
    folder = out / "deb"
    folder.mkdir(exist_ok=True)
    saved = []
    for names in (("libaio1t64", "libaio1"), ("libaio-dev",)):
        for name in names:
            done = subprocess.run(["apt-get", "download", name], cwd=folder, capture_output=True)
            if done.returncode == 0:
                saved.append(name)
                break
        else:
            print(f"apt-get download {' or '.join(names)} failed: NVMe offload needs libaio there")
    return sorted(folder.glob("*.deb"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the wheels (e.g. .gpu-wheels)")
    parser.add_argument("--libaio", action="store_true", help="add libaio's .deb packages")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    queue = [*ROOTS, *ALWAYS]
    seen: set[str] = set()
    wheels: list[Path] = []
    while queue:
        name = queue.pop(0)
        if normalise(name) in seen or not carried(name):
            continue
        seen.add(normalise(name))
        wheel = download(name, args.out)
        wheels.append(wheel)
        needs = [n for n in requirements(wheel) if carried(n) and normalise(n) not in seen]
        print(
            f"{wheel.name} ({wheel.stat().st_size / 2**20:.2f} MiB) needs {needs or 'nothing more'}"
        )
        queue += needs
    debs = libaio_debs(args.out) if args.libaio else []
    files = wheels + debs
    total = sum(p.stat().st_size for p in files)
    print(f"\n{len(wheels)} wheels, {len(debs)} .deb: {total / 2**20:.1f} MiB in {args.out}")
    stale = sorted(set(args.out.glob("*.whl")) - set(wheels))
    if stale:
        print(
            "not needed any more (remove them, the check installs every wheel there): "
            + ", ".join(p.name for p in stale)
        )
    if total > LIMIT_BYTES:
        print(f"over the {LIMIT_BYTES / 2**20:.0f} MiB a device run carries")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
