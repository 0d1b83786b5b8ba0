"""Webhook alerts: ``gradmon serve --alert-webhook URL`` posts a message per alarm and per abort.

A person who is not looking at the page learns that a run needs them. The server calls
:meth:`AlertSender.feed` with each batch of new records of a run; the sender picks the alarms
(``event`` records of kind ``alarm``, see docs/format.md) and aborts out of them and posts a small
JSON message to an incoming-webhook URL (Slack-style ``{"text": ...}`` by default; Feishu,
DingTalk and a plain JSON shape on request). The sender runs no rule of its own: for a log whose
writer does not run the alarm rule (no ``alarm_rule`` in its header: older gradmon versions, other
tools) the batches carry the alarms the server's ingest derived (``derived.py``), one rule per run.

Never in the way of the server: ``feed`` is synchronous and cheap (a bounded queue, dropping and
counting when full); one asyncio task posts, with a deadline per request, a few retries on
5xx/429/network errors, and a token-bucket rate limit that merges waiting alerts into one message
instead of losing them. Nothing here raises into the server's loop.

The posts go through httpx, which takes the proxy a cluster has from the environment
(``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``ALL_PROXY``, minus the hosts in ``NO_PROXY``) and the CA
bundle from ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` when set: Slack or Feishu are often reachable from
a training cluster only through a proxy.

Records the server reads when it starts (the existing content of each log) are history, not news:
they alert only when stamped after the server started. Records written after that alert.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from gradmon.logformat.schema import ALARM_RULE_FIELD, DERIVED_SOURCE
from gradmon.logformat.values import number

__all__ = ["FORMATS", "Alert", "AlertSender", "RateLimiter", "RunWatch", "alert_text", "check_url",
           "combine", "payload"]

log = logging.getLogger("gradmon.server.alerts")

FORMATS = ("slack", "feishu", "dingtalk", "json")
# A log's existing content is history, except records stamped at most this long before the server
# started (a writer's clock a little behind the server's, on a shared file system).
REPLAY_GRACE_S = 10.0
MAX_LINES = 10  # alerts listed by name in one merged message


@dataclass(frozen=True)
class Alert:
    """One thing to tell a person: an alarm (``kind="alarm"``) or an abort of a run."""

    run: str
    kind: str
    step: int | None
    reason: str | None
    value: float | None
    message: str
    link: str | None = None

    def as_dict(self) -> dict[str, Any]:
        value = self.value
        if isinstance(value, float) and not math.isfinite(value):
            value = str(value)  # "nan"/"inf": strict JSON has no such numbers
        return {"run": self.run, "kind": self.kind, "step": self.step, "reason": self.reason, "value": value,
                "message": self.message, "link": self.link}


# -- message building (pure) ------------------------------------------------------------------


def check_url(url: str) -> str:
    """``url`` if it is an http(s) URL with a host, else ``ValueError`` saying what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the webhook must be an http:// or https:// URL with a host, got {url[:60]!r}")
    return url


def run_link(base: str | None, run: str) -> str | None:
    """The dashboard link of ``run`` (``base`` is the page's URL)."""
    if not base:
        return None
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}run={quote(run, safe='')}"


def alert_text(alert: Alert) -> str:
    """The one-paragraph text of an alert."""
    where = f" at step {alert.step}" if alert.step is not None else ""
    if alert.kind == "abort":
        head = f"[gradmon] run {alert.run} aborted{where}: {alert.message}"
    else:
        head = f"[gradmon] alarm in run {alert.run}{where} ({alert.reason}): {alert.message}"
    return head + (f"\n{alert.link}" if alert.link else "")


def combine(alerts: list[Alert], dropped: int = 0) -> str:
    """One text for several alerts (the rate limit merged them), and a count of lost ones."""
    if len(alerts) == 1 and not dropped:
        return alert_text(alerts[0])
    lines = [f"[gradmon] {len(alerts)} alerts:"] if len(alerts) > 1 else []
    for a in alerts[:MAX_LINES]:
        lines.append(alert_text(a) if len(alerts) == 1 else "- " + alert_text(a).replace("[gradmon] ", "", 1))
    if len(alerts) > MAX_LINES:
        lines.append(f"... and {len(alerts) - MAX_LINES} more")
    if dropped:
        lines.append(f"({dropped} more alerts were dropped: the queue was full)")
    return "\n".join(lines)


def payload(fmt: str, alerts: list[Alert], dropped: int = 0) -> dict[str, Any]:
    """The JSON body for ``fmt``: ``slack`` ``{"text"}`` (also Mattermost, Rocket.Chat),
    ``feishu`` / ``dingtalk`` text messages, ``json`` the text plus every alert's fields."""
    text = combine(alerts, dropped)
    if fmt == "slack":
        return {"text": text}
    if fmt == "feishu":
        return {"msg_type": "text", "content": {"text": text}}
    if fmt == "dingtalk":
        return {"msgtype": "text", "text": {"content": text}}
    if fmt == "json":
        return {"source": "gradmon", "text": text, "alerts": [a.as_dict() for a in alerts],
                "dropped": dropped}
    raise ValueError(f"alert format must be one of {FORMATS}, got {fmt!r}")


def _step(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


class RunWatch:
    """What one run's records call for (pure): its alarms and aborts. ``observe(record, news)``
    returns the alerts; records that are not ``news`` (history) alert nothing.

    The alarms of a segment are its writer's when its header has ``alarm_rule``, else those the
    server's ingest derived (``"source": "server"``): one rule per run, never two alerts for one
    incident. An alarm for an abort (reason ``abort``) is left to the ``abort`` event's own alert."""

    def __init__(self, run: str, link: str | None = None) -> None:
        self.run = run
        self.link = link
        self.writer_alarms = False  # the current segment's writer runs the alarm rule itself

    def observe(self, record: Mapping[str, Any], news: bool) -> list[Alert]:
        kind = record.get("type")
        if kind == "header":
            self.writer_alarms = isinstance(record.get(ALARM_RULE_FIELD), Mapping)
            return []
        if kind != "event" or not news:
            return []
        event_kind = record.get("kind")
        if event_kind == "abort":
            return [Alert(self.run, "abort", _step(record.get("step")), "abort", None,
                          str(record.get("message") or "the abort policy stopped training"), self.link)]
        derived = record.get("source") == DERIVED_SOURCE
        if event_kind == "alarm" and derived != self.writer_alarms and record.get("reason") != "abort":
            return [Alert(self.run, "alarm", _step(record.get("step")), str(record.get("reason")),
                          number(record.get("value")), str(record.get("message", "")), self.link)]
        return []


class RateLimiter:
    """A token bucket: ``burst`` messages at once, then one per ``60 / per_minute`` seconds."""

    def __init__(self, per_minute: float, burst: int) -> None:
        if per_minute <= 0 or burst < 1:
            raise ValueError("the rate must be > 0 per minute and the burst >= 1")
        self.rate = per_minute / 60.0
        self.burst = burst
        self.tokens = float(burst)
        self.stamp: float | None = None

    def wait_time(self, now: float) -> float:
        """Seconds until a message may go (0: now)."""
        self._refill(now)
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.rate

    def take(self, now: float) -> None:
        self._refill(now)
        self.tokens -= 1.0

    def _refill(self, now: float) -> None:
        if self.stamp is not None:
            self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now


# -- the sender (asyncio) -----------------------------------------------------------------------


class AlertSender:
    """Posts alerts to a webhook from one asyncio task; see the module docstring.

    ``feed`` may be called before :meth:`start` (the server reads the existing logs first) and
    from the server's loop only. ``stats()`` counts what happened.
    """

    def __init__(self, url: str, *, fmt: str = "slack", link: str | None = None, per_minute: float = 6.0,
                 burst: int = 3, queue_size: int = 100, timeout: float = 5.0, retries: int = 2,
                 retry_delay: float = 2.0) -> None:
        self.url = check_url(url)
        if fmt not in FORMATS:
            raise ValueError(f"alert format must be one of {FORMATS}, got {fmt!r}")
        self.fmt = fmt
        self.link = link
        self.limiter = RateLimiter(per_minute, burst)
        self.timeout = timeout
        self.retries = retries
        self.retry_delay = retry_delay
        self.queue: asyncio.Queue[Alert] | None = None
        self.queue_size = queue_size
        self.started_at = time.time()
        self.watches: dict[str, RunWatch] = {}
        self.counts = {"alerts": 0, "sent": 0, "failed": 0, "dropped": 0, "messages": 0}
        self._pending: list[Alert] = []  # fed before start
        self._dropped_unreported = 0
        self._task: asyncio.Task | None = None
        self._client: httpx.AsyncClient | None = None  # the worker's, while it runs
        self._closed = False

    # ---- the server's side ------------------------------------------------------------------
    def feed(self, run: str, records: Iterable[Mapping[str, Any]], replay: bool = False) -> None:
        """Take a batch of new records of ``run``. ``replay``: the server is reading a log's
        existing content; such records alert only when stamped after the server started (a run
        that began meanwhile). Never raises."""
        try:
            watch = self.watches.get(run)
            if watch is None:
                watch = self.watches[run] = RunWatch(run, run_link(self.link, run))
            for record in records:
                news = not replay or (number(record.get("ts")) or 0.0) >= self.started_at - REPLAY_GRACE_S
                for alert in watch.observe(record, news):
                    self._enqueue(alert)
        except Exception:  # a malformed record must not reach the server's loop
            log.exception("alerts: cannot process records of %s", run)

    def _enqueue(self, alert: Alert) -> None:
        self.counts["alerts"] += 1
        if self.queue is None:
            if len(self._pending) < self.queue_size:
                self._pending.append(alert)
            else:
                self._drop()
            return
        try:
            self.queue.put_nowait(alert)
        except asyncio.QueueFull:
            self._drop()

    def _drop(self) -> None:
        self.counts["dropped"] += 1
        self._dropped_unreported += 1

    def start(self, link: str | None = None) -> None:
        """Start posting (on the running loop). ``link``: the dashboard's URL, unless one was given."""
        if self.link is None and link:
            self.link = link
            for watch in self.watches.values():
                watch.link = run_link(link, watch.run)
            self._pending = [replace(a, link=run_link(link, a.run)) for a in self._pending]
        self.queue = asyncio.Queue(self.queue_size)
        for alert in self._pending:
            self.queue.put_nowait(alert)
        self._pending = []
        self._task = asyncio.create_task(self._worker())

    async def close(self) -> None:
        """Stop posting (alerts still queued are lost)."""
        self._closed = True
        task, self._task = self._task, None
        if task is None:
            return
        for _ in range(3):
            # Cancel again if one was swallowed: Python < 3.12's wait_for can lose a cancellation
            # that arrives as its inner call completes, and the worker would wait on the queue forever.
            task.cancel()
            done, _pending = await asyncio.wait({task}, timeout=1.0)
            if done:
                break

    def stats(self) -> dict[str, int]:
        return {**self.counts, "queued": self.queue.qsize() if self.queue is not None else len(self._pending)}

    # ---- the posting task ---------------------------------------------------------------------
    async def _worker(self) -> None:
        async with http_client(self.timeout) as client:  # one pool and proxy setup for the server's life
            self._client = client
            try:
                await self._post_queued()
            finally:
                self._client = None

    async def _post_queued(self) -> None:
        assert self.queue is not None
        loop = asyncio.get_running_loop()
        while not self._closed:
            batch = [await self.queue.get()]
            wait = self.limiter.wait_time(loop.time())
            if wait > 0:
                await asyncio.sleep(wait)  # meanwhile more alerts queue up: they go in this message
            while not self.queue.empty():
                batch.append(self.queue.get_nowait())
            self.limiter.take(loop.time())
            dropped, self._dropped_unreported = self._dropped_unreported, 0
            self.counts["messages"] += 1
            try:
                body = json.dumps(payload(self.fmt, batch, dropped), ensure_ascii=False).encode("utf-8")
                ok = await self._deliver(body)
            except Exception:  # a bug here must not end the alerts for the rest of the server's life
                log.exception("alerts: cannot send a message")
                ok = False
            self.counts["sent" if ok else "failed"] += len(batch)

    async def _deliver(self, body: bytes) -> bool:
        for attempt in range(self.retries + 1):
            try:
                status = await post_json(self.url, body, self.timeout, self._client)
            except Exception as exc:  # timeouts, refused connections, TLS errors, bad replies
                log.warning("alerts: posting to the webhook failed (%s: %s)", type(exc).__name__, exc)
                status = None
            if status is not None and 200 <= status < 300:
                return True
            if status is not None and status != 429 and status < 500:
                log.warning("alerts: the webhook answered %s; not retrying", status)
                return False
            if attempt < self.retries:
                await asyncio.sleep(self.retry_delay * 2 ** attempt)
        return False


def http_client(timeout: float) -> httpx.AsyncClient:
    """The sender's HTTP client: proxy and CA bundle from the environment (``trust_env``), no
    redirects followed (a webhook answers where it is), ``timeout`` per connect/read/write."""
    return httpx.AsyncClient(trust_env=True, follow_redirects=False, timeout=httpx.Timeout(timeout),
                             headers={"User-Agent": "gradmon-alerts"})


async def post_json(url: str, body: bytes, timeout: float, client: httpx.AsyncClient | None = None) -> int:
    """POST ``body`` as JSON to ``url`` and return the status, all within ``timeout`` seconds
    (``asyncio.TimeoutError`` past it; ``httpx.HTTPError`` for network, proxy and TLS failures).
    Credentials in the URL (``https://user:pass@host/...``) go as Basic auth. ``client``: one from
    :func:`http_client` (default: a new one for this request)."""
    headers = {"Content-Type": "application/json; charset=utf-8"}

    async def exchange(c: httpx.AsyncClient) -> int:
        response = await c.post(url, content=body, headers=headers)
        return response.status_code

    if client is not None:
        return await asyncio.wait_for(exchange(client), timeout)
    async with http_client(timeout) as own:
        return await asyncio.wait_for(exchange(own), timeout)
