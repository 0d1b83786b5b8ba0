"""The server's ingest runs the alarm rule for logs that lack it (issue #10): the batch rule gives
AlarmRule's events; a real server's history carries the derived alarms at every size and zoom;
clients following live get each derived alarm once (across a resubscribe and a catch-up); a log
whose writer runs the rule gets nothing derived; the webhook posts once per alarm."""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from server_helpers import DEADLINE_S, StreamFollower, get_json, recv_json, recv_until, wait_for
from test_alerts import Receiver, receiver  # noqa: F401 - the fixture
from websockets.asyncio.client import connect

from gradmon.logformat.alarms import ZERO_NORM, AlarmConfig, AlarmRule, RunningBaseline
from gradmon.logformat.jsonl import encode_record
from gradmon.server import start_server
from gradmon.server.alarmrule import BatchAlarmRule, WindowBaseline
from gradmon.server.alerts import AlertSender
from gradmon.server.derived import Derived, splice

SPIKE_AT, NAN_AT, N = 6_001, 15_000, 20_000

# ------------------------------------------------------------------------------ the batch rule


def _random_run(rng: random.Random, n: int) -> list[dict]:
    """Records of a run with what the rule must judge: spikes, loss jumps, NaN and inf, odd values
    (bools, text, huge integers), zero norms (masked batches at the start too), sparse fields,
    loss-scale overflows, restarts, aborts, steps that go back."""
    recs: list[dict] = []
    step = 0
    norm0, loss0 = rng.choice([1.0, 0.01, 100.0]), rng.choice([2.0, -3.0, 0.0])
    scale = rng.choice([None, 65536.0, 1024.0])
    sparse_norm, rising = rng.random() < 0.2, rng.random() < 0.3
    # converging: the norm falls 1e5x over the run, so the run's scale (norm_floor) judges its spikes
    converging = not rising and rng.random() < 0.4
    masked = rng.choice([0, 0, 5, 25, 60])  # steps at the start whose every label is masked
    for i in range(n):
        r = rng.random()
        if r < 0.02:
            recs.append({"type": "header", "schema": 1})
            continue
        if r < 0.03:
            recs.append({"type": "event", "kind": "abort", "step": step, "message": "stopped"})
            continue
        if r < 0.04:
            step -= rng.randint(0, 30)
        step += rng.choice([1, 1, 1, 2, 5])
        rec: dict[str, Any] = {"type": "step", "step": step, "ts": 1000.0 + i}
        norm = norm0 * (1 + 0.3 * rng.gauss(0, 1)) ** 2 * ((1 + i / 50) if rising else 1)
        if converging:
            norm *= 1e-5 ** (i / n)
        loss = loss0 + 0.1 * rng.gauss(0, 1)
        q = rng.random()
        if q < 0.03:
            norm *= rng.choice([10, 30, 100, 1000])
        elif q < 0.05:
            loss += rng.choice([1, 5, 50])
        elif q < 0.06:
            norm = rng.choice([math.nan, math.inf])
        elif q < 0.07:
            loss = rng.choice([math.nan, -math.inf])
        elif q < 0.075:
            norm = rng.choice([True, "x", 10**400])
        elif q < 0.08:
            loss = rng.choice(["y", False, 7, -10**400])
        elif q < 0.1:  # a zero norm (a masked batch's loss is 0 too)
            norm = rng.choice([0.0, 0, -0.0, 1e-31, ZERO_NORM])
            loss = 0.0 if rng.random() < 0.5 else loss
        if i < masked:
            norm, loss = rng.choice([0.0, 0]), 0.0
        if not (sparse_norm and i % 7):
            rec["grad_norm"] = norm
        rec["loss"] = loss
        if "grad_norm" not in rec and rng.random() < 0.1:
            rec["nonfinite"] = True
        if scale is not None:
            if rng.random() < 0.03:
                scale = max(1.0, scale / 2) if rng.random() < 0.7 else scale * 2
            rec["loss_scale"] = scale
            if rng.random() < 0.05:
                rec.update(grad_norm=math.inf, skipped=True)
        recs.append(rec)
    return recs


def _events_one_by_one(config: AlarmConfig, recs: list[dict]) -> list[tuple[int, dict]]:
    rule, out = AlarmRule(config), []
    for i, rec in enumerate(recs):
        out += [(i, e) for e in rule.update(rec)]  # (huge integers read as infinite: values.number)
    return out + [(len(recs), e) for e in rule.finish()] + [(-1, (rule.norm_scale, rule.loss_scale))]


def _events_batched(config: AlarmConfig, recs: list[dict], rng: random.Random) -> list[tuple[int, dict]]:
    rule, out, i = BatchAlarmRule(config), [], 0
    while i < len(recs):
        if recs[i]["type"] != "step":
            out += [(i, e) for e in rule.update(recs[i])]
            i += 1
            continue
        j, stop = i, i + rng.choice([1, 3, 50, 400, 5000])
        while j < len(recs) and j < stop and recs[j]["type"] == "step":
            j += 1
        out += [(i + k, e) for k, e in rule.update_steps(recs[i:j])]
        i = j
    return out + [(len(recs), e) for e in rule.finish()] + [(-1, (rule.norm_scale, rule.loss_scale))]


CONFIGS = [AlarmConfig(), AlarmConfig(window=10, min_history=3, quiet_steps=5, overflow_proven_steps=5),
           AlarmConfig(window=2, min_history=1, quiet_steps=1),
           AlarmConfig(window=37, min_history=37, norm_ratio=2, norm_over_max=1.2, loss_over_max=1.0,
                       loss_ratio=0.1, quiet_steps=3),
           AlarmConfig(window=20, min_history=5, loss_over_max=0.5),  # (no bulk: one by one)
           AlarmConfig(window=50, min_history=7, norm_floor=0.01, quiet_steps=4),
           AlarmConfig(norm_floor=0.0)]  # the rule without the run's scale


@pytest.mark.parametrize("seed", range(49))
def test_batch_rule_gives_the_events_of_the_rule_record_by_record(seed: int) -> None:
    rng = random.Random(seed)
    config = CONFIGS[seed % len(CONFIGS)]
    recs = _random_run(rng, rng.choice([60, 600, 3000]))
    expected = _events_one_by_one(config, recs)
    got = _events_batched(config, recs, rng)
    assert json.dumps(got, default=str) == json.dumps(expected, default=str)


def test_batch_rule_on_a_clean_run_judges_few_records_one_by_one() -> None:
    rule, judged = BatchAlarmRule(), []
    one_by_one = rule.update
    rule.update = lambda rec: judged.append(rec["step"]) or one_by_one(rec)  # type: ignore[method-assign]
    recs = [{"type": "step", "step": s, "loss": 2.0 - s * 1e-4 + 0.01 * math.sin(s),
             "grad_norm": 1.0 + 0.1 * math.sin(s)} for s in range(1, 20_001)]
    assert rule.update_steps(recs) == []
    assert len(judged) < 400, len(judged)  # candidates only (new loss highs); the rest learned in bulk
    plain = RunningBaseline(200)
    for r in recs:
        plain.add(r["grad_norm"])
    assert (rule.norms.median(), rule.norms.envelope()) == (plain.median(), plain.envelope())


def test_batch_rule_takes_stretches_of_zero_norms_in_bulk() -> None:
    # One by one (AlarmRule.update), each zero norm would cost the rule ~5 µs, ~5x the index's own cost
    # per record: a long frozen stretch is taken in bulk.
    rule, judged = BatchAlarmRule(), []
    one_by_one = rule.update
    rule.update = lambda rec: judged.append(rec["step"]) or one_by_one(rec)  # type: ignore[method-assign]
    recs = [{"type": "step", "step": s, "loss": 0.0 if 1_000 < s <= 9_000 else 2.0 + 0.01 * math.sin(s),
             "grad_norm": 0.0 if 1_000 < s <= 9_000 else 1.0 + 0.1 * math.sin(s), "loss_scale": 1024.0}
            for s in range(1, 10_001)]
    recs[5_000]["loss"] = math.nan  # (judged: a non-finite loss alarms, zero norm or not)
    events = rule.update_steps(recs)
    assert [(i, e["kind"], e.get("reason")) for i, e in events] == [(5_000, "alarm", "nonfinite"),
                                                                   (5_051, "alarm_end", None)]
    assert len(judged) < 100, len(judged)
    assert (rule.norms.seen, rule.losses.seen) == (2_000, 2_000)


def test_window_baseline_matches_running_baseline() -> None:
    rng = random.Random(7)
    a, b = RunningBaseline(25), WindowBaseline(25)
    for i in range(2000):
        value, flagged = rng.expovariate(1.0), rng.random() < 0.2 or 500 < i < 560
        a.add(value, flagged)
        if flagged or rng.random() < 0.5:
            b.add(value, flagged)
        else:
            b.extend([value])
        assert (len(a), a.median(), a.envelope()) == (len(b), b.median(), b.envelope())


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 30), st.data())
def test_median_ceilings_bound_every_running_median(window, data) -> None:
    # The quiet-chunk screen's ceiling of the loss median (WindowBaseline.median_ceiling and
    # median_ceiling_after, a selection in C where it gives sorted()'s value): at least the median
    # of the window after each of the chunk's values is added, learnt values first; a ceiling any
    # lower would let the screen call quiet a chunk whose loss the rule flags.
    values = st.integers(-20, 20).map(lambda i: i / 4) | st.floats(-1e6, 1e6) | st.sampled_from([-0.0, 0.0])
    base = WindowBaseline(window)
    base.extend(data.draw(st.lists(values, min_size=1, max_size=3 * window)))
    learnt = data.draw(st.lists(values, max_size=2 * window))
    new = data.draw(st.lists(values, min_size=1, max_size=window // 2 + 1))
    ceiling = base.median_ceiling_after(learnt, new)
    grown = WindowBaseline(window)
    grown.extend([*base.recent, *learnt])
    for v in new:
        grown.extend([v])
        assert grown.median() <= ceiling
    if not learnt:
        assert base.median_ceiling(new) == ceiling


def test_splice_puts_derived_events_at_their_lines() -> None:
    def d(offset: int, before: bool, name: str) -> Derived:
        return Derived(offset, before, {"name": name}, name.encode())

    lines, offsets = [b"a", b"b", b"c"], [0, 10, 20]
    derived = [d(0, False, "after-a"), d(20, True, "before-c"), d(20, True, "before-c2")]
    assert splice(lines, offsets, derived, lambda x: x.line) == [
        b"a", b"after-a", b"b", b"before-c", b"before-c2", b"c"]
    assert splice(lines, offsets, [], lambda x: x.line) is lines


def _splice_line_by_line(items, offsets, derived, pick):
    """The definition: each item in file order, each derived event at its anchor, in order."""
    out, k, n = [], 0, len(derived)
    for item, offset in zip(items, offsets):
        while k < n and (derived[k].offset < offset or (derived[k].offset == offset and derived[k].before)):
            out.append(pick(derived[k]))
            k += 1
        out.append(item)
        while k < n and derived[k].offset == offset:
            out.append(pick(derived[k]))
            k += 1
    return out + [pick(d) for d in derived[k:]]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=12, unique=True),
       st.lists(st.tuples(st.integers(-2, 33), st.booleans()), max_size=8), st.booleans())
def test_splice_by_bisection_is_the_line_by_line_definition(offsets, events, in_order):
    offsets = sorted(offsets)
    if in_order:  # (as between() gives them; the definition's order otherwise, too)
        events = sorted(events, key=lambda e: e[0])
    lines = [f"L{o}".encode() for o in offsets]
    derived = [Derived(o, before, {"i": i}, f"D{i}".encode()) for i, (o, before) in enumerate(events)]
    assert splice(lines, offsets, derived, lambda x: x.line) == \
        _splice_line_by_line(lines, offsets, derived, lambda x: x.line)


# ------------------------------------------------------------------------------ a real server


def foreign_line(s: int, **extra: Any) -> str:
    """A step record as another tool writes it: no ``type``, Python's json.dumps (bare NaN)."""
    rec = {"step": s, "loss": 2.0 * math.exp(-s / 5000) + 0.05 + 0.01 * math.sin(0.7 * s),
           "grad_norm": 1.0 + 0.2 * math.sin(0.13 * s), "lr": 1e-3, **extra}
    return json.dumps(rec) + "\n"


def write_foreign(path: Path, first: int, last: int, spike: int = SPIKE_AT, nan: int = NAN_AT) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for s in range(first, last + 1):
            extra = {"grad_norm": 150.0} if s == spike else {"loss": math.nan} if s == nan else {}
            f.write(foreign_line(s, **extra))


def _alarm_events(events: list[dict]) -> list[tuple]:
    return [(e["kind"], e["step"], e.get("reason", e.get("start")), e.get("source"))
            for e in events if e["kind"] in ("alarm", "alarm_end")]


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    return tmp_path / "logs"


def test_history_has_one_derived_alarm_per_incident_at_every_size_and_zoom(logdir: Path) -> None:
    write_foreign(logdir / "other" / "metrics.jsonl", 1, N)
    spike = [("alarm", SPIKE_AT, "grad_norm_spike", "server"), ("alarm_end", SPIKE_AT, SPIKE_AT, "server")]
    nan = [("alarm", NAN_AT, "nonfinite", "server"), ("alarm_end", NAN_AT, NAN_AT, "server")]
    with start_server(logdir, port=0) as h:
        wait_for(lambda: get_json(h.port, "/api/runs/other")[1].get("last_step") == N)
        wait_for(lambda: not get_json(h.port, "/api/runs/other")[1]["indexing"])
        for points in (400, 2000, 8000):
            status, hist = get_json(h.port, f"/api/runs/other/history?points={points}")
            assert status == 200 and hist["exact"] is False
            assert _alarm_events(hist["events"]) == spike + nan, points
            [alarm] = [e for e in hist["events"] if e["kind"] == "alarm" and e["step"] == NAN_AT]
            assert alarm["field"] == "loss" and alarm["value"] == "NaN"  # strict JSON
        zooms = ((SPIKE_AT - 100, SPIKE_AT + 200), (SPIKE_AT, SPIKE_AT), (5_000, 16_000), (7_000, 14_000))
        for lo, hi in zooms:
            _status, hist = get_json(h.port, f"/api/runs/other/history?points=2000&start={lo}&end={hi}")
            want = [e for e in spike + nan if lo <= e[1] <= hi]
            assert _alarm_events(hist["events"]) == want, (lo, hi)
        assert h.stats()["runs"]["other"]["derived_events"] == 4


def test_a_writer_running_the_rule_gets_nothing_derived_a_later_segment_without_it_does(logdir: Path) -> None:
    path = logdir / "mixed" / "metrics.jsonl"
    path.parent.mkdir(parents=True)
    written = {"type": "event", "kind": "alarm", "step": 40, "reason": "grad_norm_spike", "value": 90.0,
               "baseline": 1.0, "message": "the writer's"}
    with open(path, "w") as f:
        rule = AlarmConfig().as_dict()
        f.write(encode_record({"type": "header", "schema": 1, "run_id": "a", "alarm_rule": rule}))
        for s in range(1, 61):
            f.write(foreign_line(s, **({"grad_norm": 90.0} if s == 40 else {})))
            if s == 40:
                f.write(encode_record(written))
        f.write(encode_record({"type": "header", "schema": 1, "run_id": "b"}))  # another writer resumes
        for s in range(61, 200):
            f.write(foreign_line(s, **({"grad_norm": 90.0} if s == 150 else {})))
        f.write(encode_record({"type": "end", "status": "finished"}))
    with start_server(logdir, port=0) as h:
        wait_for(lambda: get_json(h.port, "/api/runs/mixed")[1].get("status") == "finished")
        _status, hist = get_json(h.port, "/api/runs/mixed/history")
        assert _alarm_events(hist["events"]) == [
            ("alarm", 40, "grad_norm_spike", None),  # the writer's, never doubled
            ("alarm", 150, "grad_norm_spike", "server"),
            ("alarm_end", 150, 150, "server"),  # closed by the end record (fewer than 50 quiet steps)
        ]


@pytest.mark.parametrize("compact", [True, False])  # (gradmon's lines: the scanner's float columns)
def test_masked_batches_at_a_runs_start_derive_no_alarm(logdir: Path, compact: bool) -> None:
    # 30 steps with no gradient and a placeholder loss of 0 made the first real loss a loss_spike.
    path = logdir / "masked" / "metrics.jsonl"
    path.parent.mkdir(parents=True)
    with open(path, "w") as f:
        for s in range(1, 3001):
            zero = s <= 30 or 2000 <= s < 2100  # (a stretch later too, beside the spike)
            line = foreign_line(s, **({"loss": 0.0, "grad_norm": 0.0} if zero else
                                      {"grad_norm": 150.0} if s == 2500 else {}))
            f.write(encode_record({"type": "step", **json.loads(line)}) if compact else line)
    with start_server(logdir, port=0) as h:
        wait_for(lambda: get_json(h.port, "/api/runs/masked")[1].get("last_step") == 3000)
        wait_for(lambda: not get_json(h.port, "/api/runs/masked")[1]["indexing"])
        _status, hist = get_json(h.port, "/api/runs/masked/history")
        assert _alarm_events(hist["events"]) == [("alarm", 2500, "grad_norm_spike", "server"),
                                                 ("alarm_end", 2500, 2500, "server")]


def test_clients_following_live_get_each_derived_alarm_once(logdir: Path) -> None:
    path = logdir / "other" / "metrics.jsonl"
    write_foreign(path, 1, 300)
    with start_server(logdir, port=0, discover_interval=0.1) as h:
        wait_for(lambda: get_json(h.port, "/api/runs/other")[1].get("last_step") == 300)

        async def main() -> None:
            _status, hist = get_json(h.port, "/api/runs/other/history")
            assert _alarm_events(hist["events"]) == []
            async with connect(f"ws://127.0.0.1:{h.port}/ws") as ws:
                await recv_json(ws)  # hello
                await ws.send(json.dumps({"type": "subscribe", "runs": {"other": hist["cursor"]}}))
                follow = StreamFollower({"other": hist["cursor"]})
                write_foreign(path, 301, 400, spike=350, nan=-1)
                await recv_until(ws, lambda m: follow.feed(m) and 400 in follow.steps("other"))
                # resubscribing from where it is: nothing is sent twice
                await ws.send(json.dumps({"type": "subscribe", "runs": {"other": follow.cursors["other"]}}))
                write_foreign(path, 401, 500, spike=-1, nan=450)
                await recv_until(ws, lambda m: follow.feed(m) and 500 in follow.steps("other"))
                live = follow.records["other"]
            # a second client subscribing from the history's cursor catches up from the file
            async with connect(f"ws://127.0.0.1:{h.port}/ws") as ws2:
                await recv_json(ws2)
                await ws2.send(json.dumps({"type": "subscribe", "runs": {"other": hist["cursor"]}}))
                late = StreamFollower({"other": hist["cursor"]})
                await recv_until(ws2, lambda m: late.feed(m) and 500 in late.steps("other"))
            for records in (live, late.records["other"]):
                assert _alarm_events([r for r in records if r["type"] == "event"]) == [
                    ("alarm", 350, "grad_norm_spike", "server"), ("alarm_end", 350, 350, "server"),
                    ("alarm", 450, "nonfinite", "server")]
                kinds = [(r["type"], r["step"]) for r in records]
                # each right after the step record that raised it (the incident of 350 closes at 401)
                assert kinds.index(("event", 350)) == kinds.index(("step", 350)) + 1
                assert kinds[kinds.index(("step", 401)) + 1] == ("event", 350)
            _status, again = get_json(h.port, "/api/runs/other/history")
            assert _alarm_events(again["events"]) == _alarm_events([r for r in live if r["type"] == "event"])

        asyncio.run(asyncio.wait_for(main(), 3 * DEADLINE_S))


def test_webhook_posts_once_per_alarm_derived_or_written(logdir: Path, receiver) -> None:  # noqa: F811
    hook = receiver("ok")
    derived_log, written_log = logdir / "other" / "metrics.jsonl", logdir / "gm" / "metrics.jsonl"
    write_foreign(derived_log, 1, 100, spike=-1, nan=-1)
    sender = AlertSender(hook.url, fmt="json", per_minute=600, burst=10)
    with start_server(logdir, port=0, alerts=sender) as h:
        wait_for(lambda: len(get_json(h.port, "/api/runs")[1]["runs"]) == 1)
        write_foreign(derived_log, 101, 200, spike=150, nan=-1)
        written_log.parent.mkdir(parents=True)
        with open(written_log, "w") as f:
            f.write(encode_record({"type": "header", "schema": 1, "alarm_rule": AlarmConfig().as_dict()}))
            for s in range(1, 100):
                # stamped: a run found after the server started alerts when its records are new
                f.write(foreign_line(s, ts=time.time(), **({"grad_norm": 99.0} if s == 60 else {})))
                if s == 60:
                    f.write(encode_record({"type": "event", "kind": "alarm", "step": 60, "ts": time.time(),
                                           "value": 99.0, "reason": "grad_norm_spike",
                                           "message": "the writer's alarm"}))
        wait_for(lambda: sum(len(b["alerts"]) for b in hook.bodies) >= 2)
        wait_for(lambda: get_json(h.port, "/api/runs/gm")[1].get("last_step") == 99)
        wait_for(lambda: get_json(h.port, "/api/runs/other")[1].get("last_step") == 200)
        wait_for(lambda: sender.stats()["alerts"] == sender.stats()["sent"])  # all ingested and posted
        assert sender.stats()["alerts"] == 2
    alerts = sorted((a["run"], a["step"], a["reason"], a["message"][:18])
                    for b in hook.bodies for a in b["alerts"])
    assert alerts == [("gm", 60, "grad_norm_spike", "the writer's alarm"),
                      ("other", 150, "grad_norm_spike", "gradient norm 150 ")]
