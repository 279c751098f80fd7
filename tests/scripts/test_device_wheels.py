"""scripts/device_wheels.py: what a device machine must be carried to run the product's job.

The device image has no DeepSpeed, MLflow or pydantic and reaches no index: a device call that
finds a module missing costs minutes of a 15-minute lease. Here, on CPU: the requirements read
off a wheel are the device's (Linux, Python 3.12, no extras), and every distribution the job's
processes import is either on the image or carried.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import device_wheels as dw  # noqa: E402

# Imported by the job's libraries only when they are installed, so absent on the device is fine:
# pyspark and py4j (MLflow's Spark helpers; half a gigabyte), email-validator (pydantic's email
# types), python-multipart (starlette's form parser), pytz (pandas' time zones), sniffio (anyio),
# wcwidth (tabulate's wide characters).
NOT_CARRIED = {"pyspark", "py4j", "email-validator", "python-multipart", "pytz", "sniffio", "wcwidth"}

_IMPORTED_DISTRIBUTIONS = """
import importlib.metadata as md, json, sys
from pathlib import Path
import importlib, pkgutil
import airflow_trainpipe.runtime as runtime
from airflow_trainpipe.config import load_config
# Every module of the job's runtime (its entrypoint, as torchrun starts it, and what that imports
# on the way), the example configs parsed as the job parses its own, and what it logs with.
for info in pkgutil.walk_packages(runtime.__path__, "airflow_trainpipe.runtime."):
    importlib.import_module(info.name)
for config in sorted(Path("dags/configs").glob("*.yaml")):
    load_config(config)
import mlflow.pyfunc, mlflow.store.tracking.sqlalchemy_store
import os
modules = {name: os.path.normpath(m.__file__) for name, m in list(sys.modules.items()) if getattr(m, "__file__", None)}
tops = md.packages_distributions()
owners = {}  # a file two distributions ship (mlflow and mlflow-skinny) has both as owners
for dist_name in {d for name in modules for d in tops.get(name.split(".")[0], ())}:
    dist = md.distribution(dist_name)
    for file in dist.files or ():
        if file.suffix in (".py", ".so"):
            owners.setdefault(os.path.normpath(dist.locate_file(file)), set()).add(dist.metadata["Name"])
found = {tuple(sorted(owners[path])) for path in modules.values() if path in owners}
print(json.dumps(sorted(found)))
"""


def _wheel(tmp_path: Path, requires: list[str]) -> Path:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        lines = [
            "Metadata-Version: 2.1",
            "Name: demo",
            "Version: 1.0",
            *(f"Requires-Dist: {r}" for r in requires),
        ]
        archive.writestr("demo-1.0.dist-info/METADATA", "\n".join(lines) + "\n")
    return wheel


def test_requirements_are_read_for_linux_python_3_12_without_extras(tmp_path: Path) -> None:
    wheel = _wheel(
        tmp_path,
        [
            "always>=1",
            'old-python; python_version < "3.10"',
            'new-python; python_version >= "3.12"',
            'testing; extra == "test"',
            'windows; sys_platform == "win32"',
            'x86; platform_machine == "x86_64"',
        ],
    )
    assert [r.name for r in dw._requirements(wheel)] == ["always", "new-python", "x86"]


def test_the_image_list_parses_as_kinds_md_writes_it(tmp_path: Path) -> None:
    kinds = tmp_path / "KINDS.md"
    kinds.write_text(
        "| x | y |\nnvidia-h200: their image, 'cuda', holds these. Packages: Foo_Bar, baz.qux, torch.\n"
    )
    assert dw.image_packages(kinds) == {"foo-bar", "baz-qux", "torch"}
    assert {"torch", "transformers", "tokenizers", "numpy", "pyarrow"} <= dw.image_packages()
    assert not {"deepspeed", "mlflow-skinny", "pydantic"} & dw.image_packages()


def test_every_pin_the_script_needs_is_in_constraints() -> None:
    pinned = dw.pins(REPO / "constraints.txt")
    assert pinned["deepspeed"] and pinned["mlflow-skinny"]
    missing = [name for name in dw.JOB_NEEDS if dw._norm(name) not in pinned]
    assert not missing, f"JOB_NEEDS names {missing}, which constraints.txt does not pin"


@pytest.mark.timeout(300)
def test_every_distribution_the_job_imports_is_on_the_image_or_carried() -> None:
    import importlib.metadata as md

    out = subprocess.run(
        [sys.executable, "-c", _IMPORTED_DISTRIBUTIONS], check=True, capture_output=True, text=True, cwd=REPO
    ).stdout
    imported = [{dw._norm(name) for name in names} for names in json.loads(out.strip().splitlines()[-1])]
    image = dw.image_packages()
    # What the script carries, its requirements read off the installed (pinned) distributions.
    carried = set(dw.closure(image, lambda name: dw.device_requirements(md.requires(name) or ())))
    present = image | carried | NOT_CARRIED | {"airflow-trainpipe"}
    lacking = {name for names in imported if not names & present for name in names}
    assert not lacking, (
        f"the job imports {sorted(lacking)}, which the device image lacks and scripts/device_wheels.py "
        "does not carry: add them to its JOB_NEEDS"
    )
