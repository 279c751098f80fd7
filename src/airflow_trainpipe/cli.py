"""`trainpipe`: command-line entry point.

Each subcommand imports what it needs inside its handler: `trainpipe check` runs in CI and
pre-commit hooks and must stay as light as the DAG processor (no Airflow, torch or mlflow).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path


def _config_files(paths: Sequence[str]) -> Iterator[Path]:
    from airflow_trainpipe.config import CONFIG_SUFFIXES

    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.suffix in CONFIG_SUFFIXES and p.is_file())
        else:
            yield path


def _check(args: argparse.Namespace) -> int:
    from airflow_trainpipe.config import load_config
    from airflow_trainpipe.exceptions import ConfigError

    files = list(_config_files(args.paths))
    missing = [str(p) for p in files if not p.exists()]
    for name in missing:
        print(f"{name}: no such file or directory", file=sys.stderr)
    files = [p for p in files if p.exists()]
    if not files and not missing:
        print(f"no *.yaml or *.yml config files under {' '.join(args.paths)}", file=sys.stderr)
        return 1

    failed = bool(missing)
    owners: dict[str, Path] = {}
    for path in files:
        try:
            config = load_config(path)
        except ConfigError as exc:
            failed = True
            for problem in exc.problems:
                print(problem)
            continue
        # Two files with the same pipeline name would fight over one DAG id.
        if config.pipeline in owners:
            failed = True
            print(f"{path}: pipeline: {config.pipeline!r} is already defined by {owners[config.pipeline]}")
        else:
            owners[config.pipeline] = path
        if args.verbose:
            print(f"{path}: ok ({config.pipeline})")
    if not failed:
        print(f"{len(files)} config(s) ok", file=sys.stderr)
    return 1 if failed else 0


def _schema(args: argparse.Namespace) -> int:
    from airflow_trainpipe.config.reference import json_schema, markdown_reference

    if args.format == "markdown":
        sys.stdout.write(markdown_reference())
    else:
        json.dump(json_schema(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from airflow_trainpipe import __version__

    parser = argparse.ArgumentParser(prog="trainpipe", description="YAML-declared ML retrain pipelines for Airflow.")
    parser.add_argument("--version", action="version", version=f"trainpipe {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = commands.add_parser("check", help="validate pipeline config files or folders (exit 1 on any problem)")
    check.add_argument("paths", nargs="+", metavar="PATH", help="a config file or a folder searched for *.yaml/*.yml")
    check.add_argument("-v", "--verbose", action="store_true", help="also print a line for each valid file")
    check.set_defaults(handler=_check)

    schema = commands.add_parser("schema", help="print the config JSON Schema (for editors) or its reference")
    schema.add_argument("--format", choices=("json", "markdown"), default="json")
    schema.set_defaults(handler=_schema)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
