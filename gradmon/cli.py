"""The ``gradmon`` command line (also ``python -m gradmon``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradmon", description="gradmon: gradient-norm training monitor for MindSpore."
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    # Each subcommand module adds its own parser and sets `func`.
    from gradmon import export
    from gradmon.server import cli as serve_cli

    serve_cli.add_parser(sub)
    export.add_parser(sub)
    return parser


def _version() -> str:
    from gradmon import __version__

    return f"gradmon {__version__}"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)
