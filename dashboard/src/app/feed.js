/* Where the page's data comes from: the server (history + stream, docs/protocol.md), dropped files,
 * or a static export (window.GRADMON_EXPORT). Browser only; decisions are in lib/stream.js. */
(function (root) {
  "use strict";
  const L = root.GradmonLib;
  const A = root.GradmonApp;
  // The server answers every step of a range up to this many points (gradmon/server MAX_POINTS):
  // the page holds a run at full resolution (exact smoothing, exports) up to this many records.
  const FULL_RES_MAX = 100000;

  class Feed {
    /**
     * state: the page's state ({mode, runs, streams, runsInfo, ...}). hooks: {changed(), streamed()
     * (records of a followed run applied), setRunsInfo(list), indexingProgress(list) (how far the
     * server has read the runs it is indexing), notice(text, isError), historyPoints(), smoothing(), xMode(), shown() ->
     * [RunData], namedRuns() -> the runs the URL names (null: the default selection), onConnection(s), token}.
     */
    constructor(state, hooks) {
      this.state = state;
      this.hooks = hooks;
      this.client = null;
      this.zoomKeys = new Map();
      this.askedPoints = new Map(); // run -> points its last whole-history request asked for
      this.early = new L.EarlyHistory(null); // history requests sent before the run list came (start())
      // `?fullres=N` lowers the bound (less memory per run; also how the tests reach the lead-in path).
      this.fullResMax = hooks.fullResMax > 0 ? Math.min(FULL_RES_MAX, hooks.fullResMax) : FULL_RES_MAX;
    }

    // ------------------------------------------------------------------ live

    async start() {
      this.client = new A.Client({ token: this.hooks.token, onMessage: (m) => this.onMessage(m), onState: (s) => this.hooks.onConnection(s) });
      // What boot/early.js sent before this script was parsed (taken once; absent: nothing was).
      const sent = root.GradmonEarly || null;
      root.GradmonEarly = null;
      const sentHistory = (name) => {
        const pending = sent && sent.history(name);
        return pending ? this.client.answerOf(pending) : null;
      };
      // Without it, the runs the URL names are asked for here, beside the list.
      this.early = new L.EarlyHistory(
        sent ? null : this.hooks.namedRuns(),
        this.hooks.smoothing(),
        (name) => {
          this.state.fetches++;
          return this.client.history(name, { points: this.hooks.historyPoints() });
        },
        sentHistory,
      );
      const sentRuns = sent && sent.runs();
      if (sentRuns) {
        sentRuns.catch(() => {}); // (seen below)
        // Taken in a task of its own, after the page's scripts have run: DOMContentLoaded is theirs.
        await new Promise((r) => setTimeout(r, 0));
      }
      try {
        this.state.fetches++;
        const body = await (sentRuns ? this.client.answerOf(sentRuns) : this.client.runs());
        this.hooks.setRunsInfo(body.runs); // (the runs it follows take their early answers here)
      } catch (e) {
        this.hooks.notice("Could not list runs: " + e.message, true);
      }
      this.early.clear();
      this.client.connect();
    }

    /** Start following a run: fetch its history, then stream it. */
    follow(name) {
      if (this.state.runs.has(name)) return;
      this.state.runs.set(name, new L.RunData(name));
      this.state.streams.set(name, L.newStreamState());
      this.load(name);
    }

    /** Stop following a run: its memory goes (the protocol has no unsubscribe: its records are ignored). */
    unfollow(name) {
      this.state.runs.delete(name);
      this.state.streams.delete(name);
      this.zoomKeys.delete(name);
      this.askedPoints.delete(name);
    }

    /** Whether the run's whole history is fetched at full resolution (for exact smoothing). */
    wantsFullResolution(name) {
      const info = this.state.runsInfo.get(name);
      return this.hooks.smoothing() > 0 && !!info && typeof info.records === "number" && info.records <= this.fullResMax;
    }

    _points(name) {
      const base = this.hooks.historyPoints();
      if (!this.wantsFullResolution(name)) return base;
      const records = this.state.runsInfo.get(name).records;
      return Math.min(this.fullResMax, Math.max(base, Math.ceil(records * 1.1) + 100)); // headroom: a live run grows
    }

    async load(name) {
      if (this.state.mode !== "live") return;
      const st = this.state.streams.get(name);
      if (!st || L.requestLoad(st) === "queued") return;
      let next = "refetch";
      while (next === "refetch") {
        const run = this.state.runs.get(name);
        let cursor = null;
        try {
          const early = await this.early.take(name, this.wantsFullResolution(name));
          if (!early) this.state.fetches++;
          // (an early answer was asked for by the same rule: boot/early.js, lib/opening.js)
          const points = this._points(name);
          this.askedPoints.set(name, points);
          const resp = early || (await this.client.history(name, { points }));
          if (this.state.runs.get(name) !== run) return; // unfollowed meanwhile
          // A run list that caught up while this was on its way (the page opened during the
          // server's indexing) wants more points: taken, then asked for again (_refetchOutgrown
          // passes over a run whose first answer has not come: an empty run is exact).
          if (this._outgrown(name, resp.exact, points)) L.requestLoad(st);
          // Held at full resolution (every step kept as it streams in) only for exact smoothing.
          run.cap = resp.exact && this.wantsFullResolution(name) ? this.fullResMax : L.DEFAULT_CAP;
          run.loadHistory(resp, this.state.runsInfo.get(name));
          this.zoomKeys.delete(name);
          cursor = resp.cursor || null;
        } catch (e) {
          this.hooks.notice("Could not load run " + name + ": " + e.message, true);
        }
        if (this.state.streams.get(name) !== st) return;
        next = L.loaded(st, cursor);
      }
      this.subscribe(name);
      this.hooks.changed();
      this.onZoomEnd(this.hooks.zoom());
    }

    /** Tell the server which runs to stream, each from the cursor up to which we have it complete. */
    subscribe(only) {
      if (!this.client) return;
      const runs = L.subscribeCursors(this.state.streams, only);
      const names = Object.keys(runs);
      if (!names.length) return;
      if (this.client.send({ type: "subscribe", runs })) L.subscribed(this.state.streams, names);
    }

    onMessage(msg) {
      const st = msg.run !== undefined ? this.state.streams.get(msg.run) : undefined;
      switch (msg.type) {
        case "hello":
          this.hooks.setRunsInfo(msg.runs);
          for (const name of L.helloReloads(this.state.streams, msg.runs)) this.load(name);
          this.subscribe();
          break;
        case "runs":
          this.hooks.setRunsInfo(msg.runs);
          for (const info of msg.runs || []) if (L.fileArrived(this.state.streams.get(info.name), info)) this.load(info.name);
          this._refetchOutgrown();
          break;
        case "records":
          this._records(st, msg);
          break;
        case "indexing":
          this.hooks.indexingProgress(msg.runs || []);
          break;
        case "reset": {
          const act = L.resetAction(st, msg);
          if (act === "await-file") {
            this.state.runs.get(msg.run).loadHistory({ cursor: null, exact: true });
            this.hooks.changed();
          } else if (act === "reload") this.load(msg.run);
          break;
        }
        case "lagged":
          if (st) this.load(msg.run); // records were dropped: refetch the history
          break;
        case "error":
          console.warn("gradmon server:", msg.error);
          break;
        default:
          break; // unknown messages are ignored (forward compatibility)
      }
    }

    _records(st, msg) {
      const act = L.recordsAction(st, msg);
      if (act.action === "reload") this.load(msg.run);
      else if (act.action === "resubscribe") {
        this.state.droppedMessages++;
        this.subscribe(msg.run);
      } else if (act.action === "wait") this.state.droppedMessages++;
      if (act.action !== "apply") return;
      const run = this.state.runs.get(msg.run);
      for (const r of msg.records || []) run.ingestRecord(r);
      L.applied(st, act.cursor);
      run.cursor = act.cursor;
      const info = this.state.runsInfo.get(msg.run);
      if (info && run.lastStep !== null) info.last_step = run.lastStep;
      this.state.liveRecords += (msg.records || []).length;
      this.hooks.streamed();
    }

    /**
     * A run held downsampled although it wants full resolution (exact smoothing), whose last whole-
     * history request asked for fewer points than it needs now, is fetched again: the run list that
     * decided it was read while the server was still indexing the log (a page opened at once after
     * a start), or the run has grown. A run with no whole-history request (a replay) is left alone.
     */
    _refetchOutgrown() {
      for (const run of this.hooks.shown()) if (this._outgrown(run.name, run.exact, this.askedPoints.get(run.name))) this.load(run.name);
    }

    /** Whether a whole history asked for with `asked` points (undefined: none), `exact` or not, is short of what the run list now wants. */
    _outgrown(name, exact, asked) {
      return asked !== undefined && !exact && this.wantsFullResolution(name) && this._points(name) > asked;
    }

    /**
     * The runs shown changed: a run held downsampled that now wants more points than it was
     * fetched with (drawn alone, at two points per pixel instead of one: lib/opening.js) is fetched
     * again.
     */
    selectionChanged() {
      if (this.state.mode !== "live") return;
      for (const run of this.hooks.shown()) {
        const asked = this.askedPoints.get(run.name);
        if (asked !== undefined && !run.exact && this._points(run.name) > asked) this.load(run.name);
      }
    }

    /** Smoothing changed: runs that should now be held at full resolution are fetched again. */
    smoothingChanged() {
      if (this.state.mode !== "live") return;
      for (const run of this.hooks.shown()) if (!run.exact && this.wantsFullResolution(run.name)) this.load(run.name);
      this.onZoomEnd(this.hooks.zoom());
    }

    /**
     * After a zoom gesture: fetch a finer window of the visible step range for each shown run not
     * held at full resolution. With smoothing on, the window starts leadInSteps(alpha) earlier and
     * asks for every step (when that fits the server's full-resolution bound), so the smoothed
     * curve in view is exact within smoothing.js's bound.
     */
    async onZoomEnd(zoom) {
      if (this.state.mode !== "live") return;
      const alpha = this.hooks.smoothing();
      for (const run of this.hooks.shown()) {
        if (!zoom || run.exact) {
          if (run.detail) run.setDetail(null);
          this.zoomKeys.delete(run.name);
          continue;
        }
        const range = this._stepRange(run, zoom);
        if (!range) continue;
        const [start, end] = range;
        let from = start;
        let points = this.hooks.historyPoints();
        if (alpha > 0) {
          from = Math.max(run.firstStep !== null ? run.firstStep : 1, start - L.leadInSteps(alpha));
          if (end - from + 1 <= this.fullResMax) points = Math.max(points, end - from + 1);
        }
        const key = from + ":" + end + ":" + points;
        if (this.zoomKeys.get(run.name) === key) continue;
        this.zoomKeys.set(run.name, key);
        try {
          this.state.fetches++;
          const resp = await this.client.history(run.name, { points, start: from, end });
          if (this.state.runs.get(run.name) !== run || this.zoomKeys.get(run.name) !== key) continue;
          run.setDetail(resp, alpha > 0 ? start : undefined);
        } catch (e) {
          this.hooks.notice("Could not load detail of " + run.name + ": " + e.message, true);
        }
      }
      this.hooks.changed();
    }

    /** The integer step range of an x window for a run, in the current x-axis mode. */
    _stepRange(run, zoom) {
      let a = zoom.startValue;
      let b = zoom.endValue;
      const mode = this.hooks.xMode();
      if (mode === "wall") {
        a = run.stepAtTs(a / 1000);
        b = run.stepAtTs(b / 1000);
      } else if (mode === "relative") {
        a = run.stepAtTs(a + run.startTime);
        b = run.stepAtTs(b + run.startTime);
      }
      if (!Number.isFinite(a) || !Number.isFinite(b)) return null;
      return [Math.max(1, Math.floor(a)), Math.ceil(b)];
    }

    /**
     * Every step of [a, b] of a live run not held at full resolution, from the server: {series,
     * eval, system, exact}. Asks for as many points as the range has steps (up to the server's cap),
     * so the server answers at full resolution.
     */
    async fetchRange(name, a, b) {
      const points = Math.min(FULL_RES_MAX, Math.max(4, b - a + 1));
      this.state.fetches++;
      return this.client.history(name, { points, start: a, end: b });
    }

    // ------------------------------------------------------------------ offline

    /** A whole metrics.jsonl given as text, as a run of its own (replace one of that name). */
    addText(name, text, status) {
      const parsed = L.parseJsonl(text, { final: true });
      const run = new L.RunData(name, { cap: FULL_RES_MAX });
      for (const r of parsed.records) run.ingestRecord(r);
      run.skippedLines += parsed.skipped;
      this.state.runs.set(name, run);
      const h = run.header || {};
      this.state.runsInfo.set(name, {
        name,
        status: status || (run.ended && typeof run.ended.status === "string" ? run.ended.status : "replay"),
        records: parsed.records.length,
        last_step: run.lastStep,
        first_ts: Number.isFinite(run.startTime) ? run.startTime : Date.now() / 1000,
        header: h,
        malformed: parsed.skipped,
        offline: true,
      });
      return { name, records: parsed.records.length, skipped: parsed.skipped, partial: parsed.partial };
    }
  }

  root.GradmonApp = root.GradmonApp || {};
  Object.assign(root.GradmonApp, { Feed, FULL_RES_MAX });
})(self);
