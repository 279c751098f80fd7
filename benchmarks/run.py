"""`make bench`: measure, side by side in one run, and write BENCHMARKS.md.

Config parsing: N generated configs loaded in a fresh process (median of 3), with the typed
loader vs plain `yaml.safe_load` of the same files. This is the per-DAG cost the factory adds
at parse time on top of reading YAML (the DagBag benchmark of the factory builds on it).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "dags" / "configs" / "fraud_detector.yaml"

_TIMED = """
import sys, time
t0 = time.perf_counter()
{imports}
t1 = time.perf_counter()
from pathlib import Path
files = sorted(Path(sys.argv[1]).glob("*.yaml"))
for f in files:
    {load}
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""
VARIANTS = {
    "yaml.safe_load": ("import yaml", "yaml.safe_load(f.read_text())"),
    "yaml.load CSafeLoader": ("import yaml", "yaml.load(f.read_text(), Loader=yaml.CSafeLoader)"),
    "trainpipe load_config": ("from airflow_trainpipe.config import load_config", "load_config(f)"),
}


def _generate(folder: Path, count: int) -> None:
    text = EXAMPLE.read_text()
    for i in range(count):
        (folder / f"pipeline_{i:04d}.yaml").write_text(
            text.replace("pipeline: fraud_detector", f"pipeline: pipeline_{i:04d}")
        )


def _measure(folder: Path, imports: str, load: str, repeats: int = 3) -> tuple[float, float]:
    code = _TIMED.format(imports=imports, load=load)
    runs = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", code, str(folder)], check=True, capture_output=True, text=True
        ).stdout
        runs.append(tuple(float(x) for x in out.split()))
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def bench_config_parsing() -> list[str]:
    lines = [
        "## Config parsing (parse-time cost per pipeline)",
        "",
        "Each cell: median of 3 fresh processes. *import* is the one-off import cost; *per config* is",
        "load time divided by the number of files. Ratios are per config, same files, same run.",
        "",
        "| configs | variant | import (ms) | total load (ms) | per config (ms) |",
        "|---|---|---|---|---|",
    ]
    ratios = []
    for count in (100, 1000):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            _generate(folder, count)
            per_config = {}
            for name, (imports, load) in VARIANTS.items():
                imported, loaded = _measure(folder, imports, load)
                per_config[name] = loaded / count
                lines.append(
                    f"| {count} | {name} | {imported * 1e3:.1f} | {loaded * 1e3:.1f} | {loaded / count * 1e3:.3f} |"
                )
            ratios.append((count, per_config["trainpipe load_config"] / per_config["yaml.load CSafeLoader"]))
    lines.append("")
    lines += [
        f"- {count} configs: trainpipe load_config / yaml CSafeLoader per config = **{ratio:.2f}x** "
        "(the typed, located validation costs this much over bare libyaml parsing)"
        for count, ratio in ratios
    ]
    lines.append("")
    return lines + _worst_files()


# The files a limit guards against, and the worst file within every limit, in one fresh process.
_WORST = """
import json, statistics, sys, time
from pathlib import Path
from airflow_trainpipe.config import load_config
from airflow_trainpipe.core.exceptions import ConfigError
times = {}
for path in sys.argv[1:]:
    runs = []
    for _ in range(5):
        started = time.process_time()
        try:
            load_config(path)
        except ConfigError:
            pass
        runs.append(time.process_time() - started)
    times[Path(path).name] = statistics.median(runs)
print(json.dumps(times))
"""


def _worst_files() -> list[str]:
    import json

    from airflow_trainpipe.config.limits import MAX_FILE_BYTES
    from tests.helpers.config_work import AT_EVERY_LIMIT_NODES, at_every_limit

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        files = {"example (fraud_detector.yaml)": EXAMPLE}
        (folder / "at_every_limit.yaml").write_text(at_every_limit(EXAMPLE.read_text()))
        label = f"at every limit ({MAX_FILE_BYTES // 1024} KB, {AT_EVERY_LIMIT_NODES:,} more nodes)"
        files[label] = folder / "at_every_limit.yaml"
        files["billion laughs (10^9 nodes expanded)"] = REPO / "tests/config/hostile/billion_laughs.yaml"
        (folder / "deep.yaml").write_text("pipeline: evil\ntags: " + "[" * 20_000 + "]" * 20_000 + "\n")
        files["20,000 levels deep"] = folder / "deep.yaml"
        with open(folder / "huge.yaml", "wb") as handle:
            handle.truncate(40_000_000)
        files["40 MB (sparse)"] = folder / "huge.yaml"
        out = subprocess.run(
            [sys.executable, "-c", _WORST, *map(str, files.values())],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        times = json.loads(out)
    example = times[EXAMPLE.name]
    lines = [
        "Hostile files and the worst file within every limit (`tests/config/test_limits.py`):",
        "CPU seconds of `load_config` in one process, median of 5, against the example config.",
        "",
        "| file | ms | x example |",
        "|---|---|---|",
    ]
    lines += [
        f"| {label} | {times[path.name] * 1e3:.2f} | {times[path.name] / example:.1f} |"
        for label, path in files.items()
    ]
    return [*lines, ""]


SECTIONS = (
    "config",
    "parsing",
    "training",
    "step",
    "sources",
    "feature_store",
    "validation",
    "validation_engines",
    "scale",
    "tuning",
    "checkpoint",
    "preemption",
    "text",
    "text_quality",
    "pretrained",
    "canary",
    "fork_startup",
    "end",
)
# Sections another command writes (`make soak`: scripts/soak.py); kept as they are, after ours.
# `gpu`: benchmarks/gpu_bench.py and gpu_job.py on a GPU machine (the device tool), never on the CPU machine.
KEPT = ("soak", "soak_many", "gpu")  # written by scripts/soak.py and the GPU sessions, not by make bench


def _sections(names: list[str]) -> dict[str, list[str]]:
    from canary_bench import bench_canary
    from checkpoint_bench import bench_checkpoint  # benchmarks/ is on sys.path when run as a script
    from dag_parsing_bench import bench_dag_parsing
    from end_bench import bench_end
    from feature_store_bench import bench_feature_store
    from fork_startup_bench import bench_fork_startup
    from preemption_bench import bench_preemption
    from pretrained_bench import bench_pretrained
    from scale_bench import bench_scale
    from sources_bench import bench_sources
    from step_bench import bench_step
    from text_bench import bench_text
    from text_quality_bench import bench_text_quality
    from train_bench import bench_training
    from tune_bench import bench_tuning
    from validation_bench import bench_validation
    from validation_engines_bench import bench_validation_engines

    benches = {
        "config": bench_config_parsing,
        "parsing": bench_dag_parsing,
        "training": bench_training,
        "step": bench_step,
        "validation": bench_validation,
        "validation_engines": bench_validation_engines,
        "sources": bench_sources,
        "feature_store": bench_feature_store,
        "scale": bench_scale,
        "tuning": bench_tuning,
        "checkpoint": bench_checkpoint,
        "preemption": bench_preemption,
        "text": bench_text,
        "text_quality": bench_text_quality,
        "pretrained": bench_pretrained,
        "canary": bench_canary,
        "fork_startup": bench_fork_startup,
        "end": bench_end,
    }
    stamp = f"_Measured {datetime.now(UTC):%Y-%m-%d %H:%M UTC} by `make bench`._"
    out = {}
    for name in names:
        lines = benches[name]()
        out[name] = [lines[0], "", stamp, *lines[1:]]
    return out


def _split(text: str) -> tuple[list[str], list[list[str]]]:
    """The header and the `## ` sections of an existing BENCHMARKS.md."""
    header: list[str] = []
    sections: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("## "):
            sections.append([line])
        elif sections:
            sections[-1].append(line)
        else:
            header.append(line)
    return header, sections


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", type=Path, default=REPO / "BENCHMARKS.md")
    parser.add_argument(
        "--only",
        choices=SECTIONS,
        action="append",
        help="re-measure only this section (repeatable); the others are kept from --output",
    )
    args = parser.parse_args()
    header = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`benchmarks/run.py`); every figure below was measured by that command",
        "(`make bench ONLY=SECTION` re-measures one section; each section says when it was measured).",
        "",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, {_memory()}, no GPU; Python {platform.python_version()}",
        "",
    ]
    fresh = _sections(args.only or list(SECTIONS))
    existing = _split(args.output.read_text())[1] if args.output.exists() else []
    kept = [lines for lines in existing if args.only or _section_name(lines[0]) in KEPT]
    order = {name: i for i, name in enumerate(SECTIONS)}
    merged = {(name, lines[0]): lines for name, lines in fresh.items()}
    for lines in kept:
        name = _section_name(lines[0])
        if name not in fresh:
            merged[(name, lines[0])] = lines
    body = []
    for key in sorted(merged, key=lambda k: order.get(k[0], len(order))):
        # A section kept from the end of the file lost its trailing blank line: one between sections.
        body += [*"\n".join(merged[key]).rstrip("\n").split("\n"), ""]
    args.output.write_text("\n".join(header + body).rstrip("\n") + "\n")
    print("\n".join(header + body))


def _section_name(heading: str) -> str:
    lowered = heading.lower()
    for name, marker in (
        ("config", "config parsing"),
        ("parsing", "dag parsing"),
        ("validation_engines", "validation engines"),
        ("validation", "data validation"),
        ("feature_store", "feature store:"),
        ("sources", "sources:"),
        ("scale", "scale:"),
        ("step", "training step alone"),
        ("tuning", "tuning:"),
        ("checkpoint", "checkpoint compression"),
        ("preemption", "preemption:"),
        ("soak", "chaos soak"),
        ("soak_many", "many pipelines"),
        ("text_quality", "text quality:"),
        ("text", "text models"),
        ("pretrained", "pretrained encoders"),
        ("gpu", "gpu:"),
        ("canary", "canary:"),
        ("fork_startup", "start-up of a training job"),
        ("end", "end of a training job"),
    ):
        if marker in lowered:
            return name
    return "training"


def _memory() -> str:
    try:
        kb = int(
            next(
                line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")
            ).split()[1]
        )
        return f"{kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, StopIteration):
        return "unknown RAM"


if __name__ == "__main__":
    main()
