"""``gradmon serve LOGDIR``: the command-line entry of the server."""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import signal
import sys

__all__ = ["add_parser", "listen_error", "no_runs_note", "run_serve"]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``serve`` subcommand to the ``gradmon`` parser."""
    from gradmon.server.app import DEFAULT_PORT

    p = subparsers.add_parser(
        "serve",
        help="serve the live dashboard for the runs under LOGDIR",
        description="Serve the live dashboard (HTTP + WebSocket on one port) for every run under LOGDIR. "
        "Binds 127.0.0.1; any other --host requires a token (generated and printed in the URL "
        "unless --token is given).",
    )
    p.add_argument("logdir", metavar="LOGDIR",
                    help="log root: each directory below with a metrics.jsonl is a run")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port (default {DEFAULT_PORT}; 0 = any free port)")
    p.add_argument("--token", default=None,
                   help="access token (default: none on loopback, generated otherwise)")
    p.add_argument("--alert-webhook", metavar="URL", default=None,
                   help="post a message to this incoming-webhook URL per alarm and per aborted run "
                        "(Slack, Feishu, DingTalk, ...; rate-limited, never blocks the server)")
    p.add_argument("--alert-format", choices=("slack", "feishu", "dingtalk", "json"), default="slack",
                   help='webhook payload: slack {"text": ...} (default; also Mattermost, Rocket.Chat), '
                        "feishu, dingtalk, or json (the text plus every field)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--no-index-sidecar", action="store_true",
                       help="index runs in memory only: write no .<log>.gmidx/ index cache beside the logs")
    where.add_argument("--index-dir", metavar="DIR", default=None,
                       help="keep the runs' index caches in DIR instead of beside their logs (logs in a "
                            "read-only directory then start warm too; a cache: delete it any time)")
    p.add_argument("--alert-link", metavar="URL", default=None,
                   help="dashboard URL the messages link to (default: this server's URL, without its token)")
    p.set_defaults(func=run_serve)
    return p


def run_serve(args: argparse.Namespace) -> int:
    from gradmon.server.app import serve
    from gradmon.server.limits import raise_open_files_limit

    if not 0 <= args.port <= 65535:
        print(f"gradmon serve: --port must be in 0..65535, got {args.port}", file=sys.stderr)
        return 2
    if args.token is not None and not args.token:
        print("gradmon serve: --token must not be empty", file=sys.stderr)
        return 2
    if os.path.exists(args.logdir) and not os.path.isdir(args.logdir):
        print(f"gradmon serve: {args.logdir} is not a directory", file=sys.stderr)
        return 2
    alerts = None
    if args.alert_webhook is not None:
        from gradmon.server.alerts import AlertSender

        try:
            alerts = AlertSender(args.alert_webhook, fmt=args.alert_format, link=args.alert_link)
        except ValueError as exc:
            print(f"gradmon serve: --alert-webhook: {exc}", file=sys.stderr)
            return 2

    def ready(server) -> None:
        where = os.path.realpath(args.logdir)
        note = "" if os.path.isdir(where) else " (does not exist yet: runs appear once it does)"
        print(f"gradmon: serving runs under {where}{note}", flush=True)
        unlisted = no_runs_note(where)
        if unlisted:
            print(f"gradmon: {unlisted}", flush=True)
        if alerts is not None:  # the URL holds a secret: print only where it goes
            where = alerts.url.split("/")[2].rsplit("@", 1)[-1]
            print(f"gradmon: alerts go to the webhook at {where} ({alerts.fmt})", flush=True)
        print(f"gradmon: open {server.url}", flush=True)

    # Each WebSocket client holds a descriptor: raise the soft limit towards the hard one first.
    print(f"gradmon: {raise_open_files_limit().describe()}", flush=True)
    # A SIGTERM stops the server as Ctrl-C does: closed in order (each run's index checkpointed into
    # its sidecar, so the next start restores it instead of re-indexing).
    try:
        asyncio.run(serve(args.logdir, args.host, args.port, args.token, ready=ready, alerts=alerts,
                          index_sidecars=not args.no_index_sidecar, index_dir=args.index_dir,
                          stop_signals=(signal.SIGTERM,)))
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"gradmon serve: {listen_error(exc, args.host, args.port)}", file=sys.stderr)
        return 1
    return 0


def no_runs_note(root: str, max_depth: int = 3, limit: int = 3) -> str | None:
    """When ``root`` holds no run but ``.jsonl`` files that are not runs (a run is a directory
    holding ``metrics.jsonl``), say so and how to write them as runs; else None. A short walk
    (``max_depth`` levels), done once at start: the usual cause of a blank page."""
    from gradmon.server.runs import discover_runs

    if not os.path.isdir(root) or discover_runs(root, max_runs=1):
        return None
    found: list[str] = []
    for here, dirs, files in os.walk(root):
        depth = here[len(root):].count(os.sep)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if depth < max_depth else []
        found += [os.path.join(here, f) for f in sorted(files)
                  if f.endswith(".jsonl") and not f.startswith("metrics.")]
        if len(found) >= limit:
            break
    if not found:
        return None
    run = os.path.splitext(found[0])[0]
    more = f" and {len(found) - 1} more" if len(found) > 1 else ""
    return (f"no runs under {root} yet (a run is a directory holding metrics.jsonl), but {found[0]}{more} "
            f"is a log that is not a run: LiveMonitor({run!r}) writes the run {os.path.basename(run)!r} "
            f"(or move the file to {os.path.join(run, 'metrics.jsonl')})")


def listen_error(exc: OSError, host: str, port: int) -> str:
    """Why the server could not listen on ``host:port``, and which flag to use instead."""
    where = f"cannot listen on {host}:{port}: {exc}"
    if exc.errno == errno.EADDRINUSE:
        return (f"{where}; another program (another gradmon serve?) has that port: choose another with "
                f"--port N, or --port 0 for any free port")
    if exc.errno in (errno.EACCES, errno.EPERM) and 0 < port < 1024:
        return f"{where}; ports below 1024 need privileges: use --port {_default_port()} or --port 0"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{where}; {host} is not an address of this machine: use --host 127.0.0.1 (or 0.0.0.0 for all)"
    return where


def _default_port() -> int:
    from gradmon.server.app import DEFAULT_PORT

    return DEFAULT_PORT
