"""Render a results document (see :mod:`benchmarks.run`) as Markdown tables. Pure: dict in, str out."""

from __future__ import annotations

from typing import Any

from benchmarks.alarms_report import render_section
from benchmarks.markdown import table


def _num(v: Any, fmt: str = ".3f") -> str:
    if isinstance(v, bool) or v is None:
        return "—" if v is None else str(v)
    if isinstance(v, (int, float)):
        return format(v, fmt)
    return str(v)


def _skip_or_error(section: dict[str, Any]) -> str | None:
    if "skipped" in section:
        return f"_Not run: {section['skipped']}_\n"
    if "error" in section and not section.get("runs"):
        return f"_Failed: {section['error']}_\n"
    return None


def _ratio_rows(variants: dict[str, Any], descriptions: dict[str, str] | None = None) -> list[list[str]]:
    rows = []
    for name, v in variants.items():
        ms = v["ms_per_step"]
        r = v.get("ratio")
        desc = (descriptions or {}).get(name, "")
        if r is None:
            rows.append([name, _num(ms["median"]), "1 (baseline)", "", "", "", desc])
        else:
            rows.append(
                [
                    name,
                    _num(ms["median"]),
                    _num(r["median"]),
                    f"{_num(r['q1'])}–{_num(r['q3'])}",
                    f"{_num(r['min'])}–{_num(r['max'])}",
                    r["n"],
                    desc,
                ]
            )
    return rows


RATIO_HEADERS = ["variant", "ms/step (median)", "ratio vs plain (median)", "IQR", "min–max", "n", "what"]


def _machine(m: dict[str, Any]) -> str:
    rows = [
        ["device", m.get("device")],
        ["CPU", m.get("cpu_model")],
        ["cores (usable)", f"{m.get('cpu_count')} ({m.get('cpus_usable')})"],
        ["memory", f"{(m.get('mem_total_bytes') or 0) / 2**30:.1f} GiB"],
        ["load average at start", m.get("load_avg_at_start")],
        ["platform", m.get("platform")],
        ["python", m.get("python")],
    ]
    rows += [[k, v] for k, v in (m.get("versions") or {}).items()]
    rows.append(["started (UTC)", m.get("started_utc")])
    return table(["", ""], rows)


def _step(sec: dict[str, Any]) -> str:
    out = [f"gradmon cells: {sec.get('gradmon_cells')}\n"]
    out += [f"- {n}" for n in sec.get("notes", [])]
    out.append("")
    for run in sec.get("runs", []):
        title = f"#### {run.get('mode')} · {run.get('model')}"
        if "params" in run:
            title += f" ({run['params']:,} params, batch {run.get('batch')})"
        out.append(title + "\n")
        if "skipped" in run:
            out.append(f"_Not run: {run['skipped']}_\n")
            continue
        if "error" in run:
            out.append(f"_Failed: {run['error']}_ {' '.join(run.get('stderr_tail', []))[-500:]}\n")
            continue
        out.append(
            f"{run.get('blocks')} blocks of {run.get('steps_per_block')} steps, {run.get('rounds')} "
            f"rounds, {run.get('wall_s', 0):.0f} s wall.\n"
        )
        out.append(table(RATIO_HEADERS, _ratio_rows(run["variants"], sec.get("variants"))))
        for name, why in (run.get("unavailable") or {}).items():
            out.append(f"- `{name}` not available: {why}")
        out.append("")
    return "\n".join(out) + "\n"


def _norm(sec: dict[str, Any]) -> str:
    out = []
    for run in sec.get("runs", []):
        out.append(
            f"#### GRAPH · {run.get('model')} ({run.get('params', 0):,} params in "
            f"{run.get('tensors')} tensors)\n"
        )
        if "error" in run:
            out.append(f"_Failed: {run['error']}_\n")
            continue
        rows = []
        for kind, m in run.get("micro", {}).items():
            if "error" in m:
                rows.append([kind, "—", m["error"]])
            elif m.get("floor"):
                rows.append([kind, _num(m["ms_per_call"]["median"]), "(floor probe, not a norm)"])
            else:
                rows.append([kind, _num(m["ms_per_call"]["median"]), f"{m['rel_error']:.1e}"])
        kernel = run.get("kernel")
        if kernel:
            state = "available" if kernel.get("available") else f"not available ({kernel.get('reason')})"
            out.append(f"Fused kernel: {state}; CPUs usable {kernel.get('cpus_usable', '?')}.\n")
        out.append("Norm alone (`NormOnly`):\n")
        out.append(table(["norm form", "ms/call (median)", "rel. error vs float64"], rows))
        probes = run.get("probes", {})
        desc = {k: f"norm={v['norm']} clip={v['clip']} ring={v['ring']}" for k, v in probes.items()}
        out.append("\nInside a training step (`ProbeStep`):\n")
        out.append(table(RATIO_HEADERS, _ratio_rows(run["in_step"]["variants"], desc)))
        for name, why in (run.get("unavailable") or {}).items():
            out.append(f"- `{name}` not available: {why}")
        out.append("")
    return "\n".join(out) + "\n"


def _mib(v: Any) -> str:
    return _num(v, ".1f")


def _memory(sec: dict[str, Any]) -> str:
    out = []
    descriptions = sec.get("variants", {})
    for run in sec.get("runs", []):
        variants, summary = run.get("variants", {}), run.get("summary", {})
        plain = variants.get("plain", {})
        title = f"#### {run.get('model')}"
        if "params" in plain:
            title += (f" ({plain['params']:,} params, gradients {plain['grad_bytes'] / 2**20:.1f} MiB; "
                      f"bound {summary.get('bound_mib', 0):.0f} MiB)")
        out.append(title + "\n")
        rows = []
        for name, v in variants.items():
            if "error" in v:
                rows.append([name, "—", "—", "—", "—", "—", "—", f"failed: {v['error']}"])
                continue
            s = summary.get(name, {})
            p0 = plain.get("compiled_bytes", 0)
            r0 = plain.get("runtime_bytes", 0)
            rows.append([
                name, v.get("norm_strategy") or "—", _mib(v["peak_bytes"] / 2**20),
                _mib(s["extra_mib"]) if s else "0 (baseline)",
                _mib((v["compiled_bytes"] - p0) / 2**20) if s else "",
                _mib((v["runtime_bytes"] - r0) / 2**20) if s else "",
                ("yes" if s["within_bound"] else "**no**") if s else "", descriptions.get(name, ""),
            ])
        out.append(table(["variant", "norm_strategy", "peak MiB", "extra MiB", "of which compiled graph",
                          "of which runtime", "extra within bound", "what"], rows))
        out.append("")
    for n in sec.get("notes", []):
        out.append(f"- {n}")
    return "\n".join(out) + "\n"


def _logging(sec: dict[str, Any]) -> str:
    out = []
    rows = []
    for c in sec.get("callback", []):
        rows.append(
            [
                c["cell"],
                c["log_interval"],
                _num(c.get("nonlog_us", {}).get("median"), ".1f"),
                _num(c.get("log_us", {}).get("median"), ".1f"),
                c["reads_nonlog_steps"],
                c["reads_log_steps"],
            ]
        )
    if rows:
        out.append(
            table(
                [
                    "step cell",
                    "log_interval",
                    "non-log step µs (median)",
                    "log step µs (median)",
                    "device reads on non-log steps",
                    "device reads on log steps",
                ],
                rows,
            )
        )
    w = sec.get("writer")
    if w:
        rows = [
            [k, _num(v["records_per_s"], ",.0f"), _num(v["mb_per_s"], ".1f"), _num(v["us_per_record"], ".2f")]
            for k, v in w.items()
            if isinstance(v, dict)
        ]
        out.append(f"\nJSONL writes ({w['records']} step records, one write + flush each):\n")
        out.append(table(["writer", "records/s", "MB/s", "µs/record"], rows))
    for name, why in (sec.get("unavailable") or {}).items():
        out.append(f"- `{name}` not available: {why}")
    if "error" in sec:
        out.append(f"_Failed: {sec['error']}_")
    return "\n".join(out) + "\n"


def _server(sec: dict[str, Any]) -> str:
    out = []
    lat = sec.get("latency", [])
    if lat:
        rows = [
            [
                x["clients"],
                x["rate"],
                x.get("received", "—"),
                _num(x.get("p50_ms"), ".1f"),
                _num(x.get("p99_ms"), ".1f"),
                _num(x.get("max_ms"), ".1f"),
                _num(x.get("server_cpu_percent"), ".0f"),
                x.get("error", ""),
            ]
            for x in lat
        ]
        out.append("Flush → WebSocket receive latency:\n")
        out.append(
            table(
                [
                    "clients",
                    "records/s",
                    "records received (all clients)",
                    "p50 ms",
                    "p99 ms",
                    "max ms",
                    "server CPU %",
                    "note",
                ],
                rows,
            )
        )
    if "idle_cpu_percent" in sec:
        out.append(
            f"\nServer CPU while idle (1 client connected): {_num(sec['idle_cpu_percent'], '.1f')} %\n"
        )
    hist = sec.get("history", [])
    if hist:
        rows = [
            [
                h["records"],
                _num(h.get("file_mb"), ".0f"),
                _num(h.get("index_s"), ".1f"),
                _num(h.get("first_fetch_ms"), ".0f"),
                _num(h.get("fetch_ms"), ".0f"),
                _num(h.get("fetch_kb"), ".0f"),
                _num(h.get("rss_mb"), ".0f"),
                h.get("error", h.get("skipped", "")),
            ]
            for h in hist
        ]
        out.append("\nHistory of a big run (`/api/runs/<name>/history`, default points):\n")
        out.append(
            table(
                [
                    "records",
                    "file MB",
                    "server ready/indexed s",
                    "first fetch ms",
                    "fetch ms (median)",
                    "response KB",
                    "server RSS MB",
                    "note",
                ],
                rows,
            )
        )
    if sec.get("stress"):
        out.append(_server_stress(sec["stress"]))
    for n in sec.get("notes", []):
        out.append(f"- {n}")
    if "error" in sec:
        out.append(f"_Failed: {sec['error']}_")
    return "\n".join(out) + "\n"


def _server_stress(st: dict[str, Any]) -> str:
    """Issue #14's table: live p99 under history load and indexing, abuse, idle clients."""
    zoom, abuse, idle = st.get("zoom", {}), st.get("abuse", {}), st.get("idle", {})
    z_ms = zoom.get("zoom_ms", {})

    def p99(block: dict[str, Any], key: str = "p99_ms") -> str:
        return _num(block.get(key), ".1f")

    rows = [
        ["quiet (median of block p99s)", p99(zoom.get("quiet", {}), "p99_ms_median"), "≤ 50", ""],
        ["another client zooming on the big run", p99(zoom.get("zooming", {}), "p99_ms_median"), "≤ 50",
         f"zoom p50 {_num(z_ms.get('p50_ms'), '.0f')} ms, {z_ms.get('n', '—')} zooms"],
        ["while the big run is indexed", p99(zoom.get("indexing", {})), "≤ 50",
         f"indexed in {_num(zoom.get('indexing', {}).get('indexed_s'), '.1f')} s with the page connected; "
         f"{zoom.get('indexing', {}).get('while_indexing', '—')} records written meanwhile"],
        ["a client floods bad subscribes, never reads", p99(abuse.get("abused", {})), "",
         f"HTTP p99 {p99(abuse.get('http_ms', {}))} ms"],
        [f"{idle.get('idle_clients', '—')} idle clients connected", p99(idle.get("healthy", {})), "≤ 100",
         f"server RSS {_num(idle.get('rss_mb_before'), '.0f')} → "
         f"{_num(idle.get('rss_mb_connected'), '.0f')} MB"],
    ]
    errors = [f"{k}: {v['error']}" for k, v in (("zoom", zoom), ("abuse", abuse), ("idle", idle))
              if "error" in v]
    rss = (f"\nServer RSS under the abuse: {_num(abuse.get('rss_mb_before'), '.0f')} MB before, "
           f"{_num(abuse.get('rss_mb_peak'), '.0f')} MB at peak, {_num(abuse.get('rss_mb_after'), '.0f')} MB "
           f"3 s after the client left (target: before + 10 MB).\n")
    return ("\nLive pushes under load (flush → receive, one measuring client; "
            f"big run: {zoom.get('big_steps', '—')} steps):\n\n"
            + table(["while", "live p99 ms", "target", "note"], rows) + rss
            + "".join(f"\n_Failed: {e}_\n" for e in errors))


def _page(sec: dict[str, Any]) -> str:
    rows = [
        [k, _num(v, ".1f") if isinstance(v, (int, float)) else v]
        for k, v in sec.items()
        if k not in ("section_wall_s", "notes", "about") and not isinstance(v, (dict, list))
    ]
    out = [table(["measure", "value"], rows)]
    for n in sec.get("notes", []):
        out.append(f"- {n}")
    return "\n".join(out) + "\n"


RENDERERS = {"step": _step, "norm": _norm, "memory": _memory, "logging": _logging, "server": _server,
             "page": _page, "alarms": render_section}
TITLES = {
    "step": "Step overhead",
    "norm": "Norm / clip / history forms (for the cell)",
    "memory": "Peak memory of the norm (per strategy)",
    "logging": "Logging path",
    "server": "Server",
    "page": "Dashboard page",
    "alarms": "Alarms (`python -m benchmarks.alarms`)",
}


def render(results: dict[str, Any]) -> str:
    """The whole Markdown report."""
    out = ["# gradmon benchmark results\n"]
    if results.get("smoke"):
        out.append("**SMOKE RUN: tiny sizes, numbers are not meaningful.**\n")
    out.append("See `benchmarks/README.md` for what each number means and how it is measured.\n")
    out.append("## Machine\n")
    out.append(_machine(results.get("machine", {})))
    for name, sec in results.get("sections", {}).items():
        out.append(f"\n## {TITLES.get(name, name)}\n")
        note = _skip_or_error(sec)
        if note:
            out.append(note)
            continue
        try:
            out.append(RENDERERS[name](sec))
        except Exception as exc:  # a report must never lose the JSON's numbers: say what broke
            out.append(f"_Could not render this section ({type(exc).__name__}: {exc}); see the JSON._\n")
        out.append(f"_Section wall time: {sec.get('section_wall_s', 0):.0f} s_\n")
    out.append(f"\nSuite wall time: {results.get('suite_wall_s', 0):.0f} s\n")
    return "\n".join(out)
