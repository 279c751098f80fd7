"""The wheels a device machine needs to run the product's job, downloaded into `.whl/`.

The device machine (an H100/H200 lent to some sessions, for issue 55's measurements) can reach no
package index. Its image holds torch, transformers, tokenizers, numpy, pyarrow, pandas and more
(/work/.library/device/KINDS.md), but not DeepSpeed, MLflow or pydantic; those travel as wheels
in `.whl/`, which the device call names in `carry` and installs with
`pip install --no-index --no-deps --target /tmp/site .whl/*.whl` (benchmarks/gpu_levers.py's
docstring has the whole command).

What travels: the distributions `trainpipe train` and the benches' workers import that the image
lacks (JOB_NEEDS, read off the modules a `gpu_levers.py --tiny` run's processes held), and every
distribution those require, transitively, that the image lacks too, each at the version
constraints.txt pins. A distribution the image has stays the image's (its torch, its
transformers). DeepSpeed publishes no wheel: its sdist is built here into a pure-Python wheel
(its ops are compiled just in time on the device, as on CPU). Wheels for the device's Python
(3.12, x86-64 manylinux); the whole folder must fit the device call's 64 MiB working tree.

    python scripts/device_wheels.py [--dest .whl] [--image-packages KINDS.md]

Run it here, where pip reaches an index, before the first device call of a session.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
PYTHON = "3.12"
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]
# Read on 2026-11-28 off the modules held by every process of `gpu_levers.py --tiny` (the job's
# ranks, the HF Trainer's and the bare loop's workers), less what the image has. Not pyspark or
# py4j: MLflow imports pyspark only when it is installed, and it is half a gigabyte.
JOB_NEEDS = (
    "deepspeed",
    "mlflow-skinny",
    "mlflow-tracing",
    "pydantic",
    "pydantic-extra-types",
    "croniter",
    "zstandard",
    "sqlalchemy",  # the job's MLflow store (sqlite:///...) is MLflow's SQLAlchemy store
    "alembic",
    "dill",
    "boto3",
)
# The device image's distributions, as /work/.library/device/KINDS.md lists them (read there on
# 2026-11-28; the image as last read on a machine on 2026-11-17). `--image-packages KINDS.md` reads
# a newer list.
IMAGE_PACKAGES = """
    absl-py, accelerate, aiofiles, aiohappyeyeballs, aiohttp, aiosignal, annotated-doc, anyio,
    attrs, botorch, build, certifi, charset-normalizer, chex, click, cloudpickle, cmake,
    colorama, contourpy, coverage, cuda-bindings, cuda-core, cuda-pathfinder, cuda-toolkit,
    cupy-cuda13x, cycler, cython, diffrax, e3nn, einops, equinox, etils, execnet, filelock,
    flatbuffers, flax, fonttools, formulaic, frozenlist, fsspec, gpytorch, grpcio, h11, h5py,
    hf-xet, httpcore, httpx, huggingface-hub, humanize, hypothesis, idna, imageio, iniconfig,
    interface-meta, jax, jax-cuda13-pjrt, jax-cuda13-plugin, jaxlib, jaxtyping, jinja2, joblib,
    kiwisolver, lazy-loader, lightning, lightning-utilities, linear-operator, lineax, llvmlite,
    lxml, markdown, markdown-it-py, markupsafe, matplotlib, mdurl, meson, ml-dtypes, mpi4py,
    mpmath, msgpack, multidict, multipledispatch, mypy-extensions, nanobind, narwhals, networkx,
    ninja, numba, numba-cuda, numpy, numpyro, nvidia-cublas, nvidia-cuda-cupti,
    nvidia-cuda-nvrtc, nvidia-cuda-runtime, nvidia-cudnn-cu13, nvidia-cufft, nvidia-cufile,
    nvidia-curand, nvidia-cusolver, nvidia-cusparse, nvidia-cusparselt-cu13, nvidia-ml-py,
    nvidia-nccl-cu13, nvidia-nvjitlink, nvidia-nvshmem-cu13, nvidia-nvtx, onnx, onnx-ir,
    onnxruntime, onnxscript, opencv-python-headless, optax, opt-einsum, opt-einsum-fx,
    optimistix, orbax-checkpoint, packaging, pandas, pathspec, patsy, peft, pillow, pip, pluggy,
    portalocker, prometheus-client, propcache, protobuf, psutil, pyarrow, pybind11, py-cpuinfo,
    pygments, pyparsing, pyproject-hooks, pyre-extensions, pytest, pytest-benchmark, pytest-cov,
    pytest-mock, pytest-timeout, pytest-xdist, python-dateutil, pytorch-lightning, pyyaml,
    regex, requests, rich, sacrebleu, safetensors, scikit-build-core, scikit-image,
    scikit-learn, scipy, seaborn, sentencepiece, sentence-transformers, setuptools, shellingham,
    simplejson, six, sortedcontainers, statsmodels, sympy, tabulate, tensorboard,
    tensorboard-data-server, tensorstore, threadpoolctl, tifffile, tiktoken, timm, tokenizers,
    toolz, torch, torchaudio, torchdiffeq, torch-geometric, torchmetrics, torchvision, tqdm,
    transformers, treescope, triton, typer, typing-extensions, typing-inspect, urllib3, uvloop,
    wadler-lindig, werkzeug, wheel, wrapt, xarray, xxhash, yarl, zipp
"""
LIMIT_BYTES = 56 * 2**20  # the call's 64 MiB less the working tree (~4 MiB) and some room


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages(kinds: Path | None = None) -> set[str]:
    """The distributions the device image holds (never carried: the image's stay), from KINDS.md's
    line that lists them, or IMAGE_PACKAGES."""
    listed = IMAGE_PACKAGES
    if kinds is not None:
        lines = [
            line for line in kinds.read_text().splitlines() if "their image" in line and "Packages: " in line
        ]
        if not lines:
            raise SystemExit(f"{kinds}: no 'Packages: ...' line listing the device image's distributions")
        listed = lines[0].split("Packages: ", 1)[1]
    return {_norm(name.strip()) for name in listed.rstrip(". \n").split(",") if name.strip()}


def pins(constraints: Path) -> dict[str, str]:
    out = {}
    for line in constraints.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[_norm(name)] = version.strip()
    return out


def _download(name: str, version: str, dest: Path) -> Path:
    """One distribution's wheel for the device's Python, no dependencies."""
    before = set(dest.iterdir())
    if _norm(name) == "deepspeed":  # sdist only: built here, ops left to the device's JIT
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary=:all:", "-d", tmp,
                 f"deepspeed=={version}"],
                check=True,
            )  # fmt: skip
            sdist = next(Path(tmp).glob("deepspeed-*.tar.gz"))
            subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dest),
                 str(sdist)],
                check=True,
                env={**os.environ, "DS_BUILD_OPS": "0"},
            )  # fmt: skip
    else:
        platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             "--python-version", PYTHON, "--implementation", "cp", *platforms, "-d", str(dest),
             f"{name}=={version}"],
            check=True,
        )  # fmt: skip
    new = [p for p in set(dest.iterdir()) - before if p.suffix == ".whl"]
    if len(new) != 1:
        raise SystemExit(f"{name}=={version}: expected one new wheel in {dest}, got {new}")
    return new[0]


# The device's platform, for the environment markers of a requirement.
DEVICE_ENVIRONMENT = {"python_version": PYTHON, "python_full_version": f"{PYTHON}.3", "sys_platform": "linux",
                      "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
                      "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}  # fmt: skip


def device_requirements(requires: Iterable[str]) -> list[Requirement]:
    """Of `Requires-Dist` values, those that apply on the device (Linux, Python 3.12, no extras)."""
    found = [Requirement(line) for line in requires]
    return [r for r in found if r.marker is None or r.marker.evaluate(DEVICE_ENVIRONMENT)]


def _requirements(wheel: Path) -> list[Requirement]:
    """What a wheel requires on the device."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(metadata).decode()
    prefix = "Requires-Dist:"
    return device_requirements(
        line[len(prefix) :].strip() for line in text.splitlines() if line.startswith(prefix)
    )


def closure(image: set[str], requirements_of: Callable[[str], list[Requirement]]) -> list[str]:
    """JOB_NEEDS and what they require, transitively, less the image's: what the device is carried,
    in the order found. `requirements_of(name)`: what that distribution requires on the device."""
    queue, seen = [*JOB_NEEDS], []
    while queue:
        name = _norm(queue.pop(0))
        if name in seen or name in image:
            continue
        seen.append(name)
        queue.extend(r.name for r in requirements_of(name))
    return seen


def collect(dest: Path, image: set[str], pinned: dict[str, str]) -> list[Path]:
    """The closure's wheels, each at its pin, downloaded into `dest`."""
    wheels: list[Path] = []

    def download(name: str) -> list[Requirement]:
        if name not in pinned:
            raise SystemExit(f"{name}: required on the device but not pinned in constraints.txt")
        wheels.append(_download(name, pinned[name], dest))
        return _requirements(wheels[-1])

    closure(image, download)
    return wheels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--dest", type=Path, default=REPO / ".whl")
    parser.add_argument("--image-packages", type=Path, help="a KINDS.md whose line lists the image's")
    args = parser.parse_args()
    shutil.rmtree(args.dest, ignore_errors=True)
    args.dest.mkdir(parents=True)
    wheels = collect(args.dest, image_packages(args.image_packages), pins(REPO / "constraints.txt"))
    total = sum(w.stat().st_size for w in wheels)
    for wheel in sorted(wheels):
        print(f"{wheel.stat().st_size / 2**20:7.2f} MiB  {wheel.name}")
    print(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB in {args.dest}")
    if total > LIMIT_BYTES:
        raise SystemExit(
            f"{total / 2**20:.1f} MiB: over the {LIMIT_BYTES / 2**20:.0f} MiB the device call can carry"
        )


if __name__ == "__main__":
    main()
