"""`trainpipe check` (validate configs, every problem located) and `trainpipe schema` (the JSON
Schema for editors, or the reference). Light: CI and pre-commit hooks run them without Airflow,
torch or mlflow."""

from __future__ import annotations

import argparse
import json
import sys

from airflow_trainpipe.cli.common import config_files


def _check(args: argparse.Namespace) -> int:
    from airflow_trainpipe.config import load_config
    from airflow_trainpipe.config.files import printable_name
    from airflow_trainpipe.config.loader import duplicate_pipeline
    from airflow_trainpipe.core.exceptions import ConfigError

    files = list(config_files(args.paths))
    missing = [printable_name(p) for p in files if not p.exists() and not p.is_symlink()]
    for name in missing:
        print(f"{name}: no such file or directory", file=sys.stderr)
    files = [p for p in files if p.exists() or p.is_symlink()]
    if not files and not missing:
        print(f"no *.yaml or *.yml config files under {' '.join(args.paths)}", file=sys.stderr)
        return 1

    broken = len(missing)
    owners: dict[str, str] = {}
    for path in files:
        name = printable_name(path)
        try:
            config = load_config(path)
        except ConfigError as exc:
            broken += 1
            for problem in exc.problems:
                print(problem)
            continue
        if config.pipeline in owners:
            broken += 1
            print(duplicate_pipeline(name, config.pipeline, owners[config.pipeline]))
        else:
            owners[config.pipeline] = name
        if args.verbose:
            print(f"{name}: ok ({config.pipeline})")
    checked = len(files) + len(missing)
    if broken:
        # The tally a CI log's reader looks for at its end: how many are wrong, and how many hold.
        print(f"{broken} of {checked} config(s) have problems; {checked - broken} ok", file=sys.stderr)
    else:
        print(f"{checked} config(s) ok", file=sys.stderr)
    return 1 if broken else 0


def _schema(args: argparse.Namespace) -> int:
    from airflow_trainpipe.config.reference import json_schema, markdown_reference

    if args.format == "markdown":
        sys.stdout.write(markdown_reference())
    else:
        json.dump(json_schema(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = commands.add_parser(
        "check", help="validate pipeline config files or folders (exit 1 on any problem)"
    )
    check.add_argument(
        "paths", nargs="+", metavar="PATH", help="a config file or a folder searched for *.yaml/*.yml"
    )
    check.add_argument("-v", "--verbose", action="store_true", help="also print a line for each valid file")
    check.set_defaults(handler=_check)
    schema = commands.add_parser("schema", help="print the config JSON Schema (for editors) or its reference")
    schema.add_argument("--format", choices=("json", "markdown"), default="json")
    schema.set_defaults(handler=_schema)
