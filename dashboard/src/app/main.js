/* The page's wiring: state, the view in the URL, controls, and the window.gradmon handle. The logic
 * lives in lib/ (pure, node-tested); data flow in feed.js, charts in charts.js/card.js, the run
 * table in runs.js, alarms in banner.js, exports in exporter.js. */
(function (root) {
  "use strict";
  const L = root.GradmonLib;
  const A = root.GradmonApp;
  // Distinct run colours; red is kept for spike and non-finite marks.
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#17becf", "#e377c2", "#8c564b", "#bcbd22", "#7f7f7f", "#5f6bd0"];
  const URL_WRITE_MS = 150;
  const FIRST_DRAW_HOLD_MS = 1500; // the longest the first draw waits for the other runs shown at opening

  const $ = (sel) => document.querySelector(sel);
  const exportData = root.GRADMON_EXPORT && typeof root.GRADMON_EXPORT === "object" ? root.GRADMON_EXPORT : null;
  const parsed = L.parseView(location.search);
  // A static export opens in the view it was exported with, unless its URL says otherwise.
  const initial = exportData && typeof exportData.view === "string" && L.sameView(parsed.view, L.defaultView()) ? L.parseView(exportData.view).view : parsed.view;
  const param = (k) => Number(parsed.other.filter(([key]) => key === k).map(([, v]) => v)[0]);
  const pointsParam = param("points"); // history points per request (default: two per pixel of chart width)
  const fullResParam = param("fullres"); // records up to which a run is held at full resolution (default 100000)

  const state = {
    // "offline": no server (opened from disk, or a static export: then `exported`)
    mode: exportData || location.protocol === "file:" ? "offline" : "live",
    exported: !!exportData,
    connection: exportData ? "export" : location.protocol === "file:" ? "offline" : "connecting",
    runsInfo: new Map(), // name -> info from the server ({status, records, last_step, first_ts, header, ...}) or a replay
    runs: new Map(), // name -> RunData of the runs followed (selected) and replays
    streams: new Map(), // name -> stream state (lib/stream.js) of the runs followed live
    view: initial,
    selected: [], // names shown, in selection order
    colors: new Map(),
    pendingZoom: initial.zoom,
    notice: "",
    fetches: 0,
    liveRecords: 0,
    droppedMessages: 0,
  };
  let board = null;
  let feed = null;
  let table = null;
  let banner = null;
  let alarmDetail = null;
  let exporter = null;
  let nextColor = 0;
  let urlTimer = null;
  let firstData = 0; // when the first run shown at opening got its history (0: none yet)
  let opened = false; // every run shown at opening has its history (or the hold ran out)
  let scrolledToExpanded = !initial.expanded; // only a view opened from a URL scrolls to its expanded chart
  let listed = false; // the server's run list has arrived (or failed)

  function colorOf(name) {
    if (!state.colors.has(name)) state.colors.set(name, PALETTE[nextColor++ % PALETTE.length]);
    return state.colors.get(name);
  }

  /** The runs drawn: selected, matching the filter, with data held. */
  function entries() {
    const f = L.runFilter(state.view.filter);
    return state.selected.filter((n) => state.runs.has(n) && f.test(n)).map((n) => ({ run: state.runs.get(n), color: colorOf(n) }));
  }

  function setNotice(text, isError) {
    state.notice = text;
    const n = $("#notice");
    n.textContent = text;
    n.className = isError ? "notice error" : "notice";
    n.hidden = !text;
  }

  // ---------------------------------------------------------------- view in the URL

  function writeUrl() {
    clearTimeout(urlTimer);
    urlTimer = setTimeout(() => {
      const q = L.formatView(state.view, parsed.other);
      if (q === location.search || (q === "" && location.search === "")) return;
      try {
        history.replaceState(history.state, "", location.pathname + q + location.hash);
      } catch (e) {
        // some file:// setups refuse it: the view then lives in this page only
      }
    }, URL_WRITE_MS);
  }

  function panelView(id) {
    return L.panelView(state.view, id);
  }

  function onPanelChange(id, what, value) {
    L.changePanel(state.view, id, what, value);
    writeUrl();
    changed();
  }

  // ---------------------------------------------------------------- runs and selection

  function setRunsInfo(list) {
    listed = true;
    const old = state.runsInfo;
    state.runsInfo = new Map();
    for (const r of list || []) state.runsInfo.set(r.name, r);
    for (const r of old.values()) {
      if (state.runsInfo.has(r.name)) continue;
      // Replays stay; a selected run whose file went away stays drawn, marked as such.
      if (r.offline) state.runsInfo.set(r.name, r);
      else if (state.selected.includes(r.name)) state.runsInfo.set(r.name, Object.assign({}, r, { status: "removed" }));
    }
    updateSelection();
  }

  /**
   * How far the server has read the runs it is still indexing (an `indexing` message: [{name, offset,
   * file_bytes, records, last_step}]): their entries follow it, and the run table shows it (the
   * entries' `indexing` ends with the server's next run list).
   */
  function indexingProgress(list) {
    for (const p of list) {
      const info = state.runsInfo.get(p.name);
      if (!info || !info.indexing) continue;
      info.cursor = Object.assign({}, info.cursor, { offset: p.offset });
      Object.assign(info, { file_bytes: p.file_bytes, records: p.records, last_step: p.last_step });
    }
    if (table) table.refresh();
  }

  /** The selection from the view (or the default: the newest runs), and the runs followed for it. */
  function updateSelection() {
    const infos = Array.from(state.runsInfo.values());
    const shownBefore = shownCount();
    state.selected = state.view.runs !== null ? state.view.runs.slice() : L.defaultSelection(infos, L.DEFAULT_RUN_CAP);
    for (const n of state.selected) colorOf(n);
    if (feed && state.mode === "live") {
      for (const n of state.selected) if (state.runsInfo.has(n) && !state.runsInfo.get(n).offline) feed.follow(n);
      for (const n of Array.from(state.runs.keys())) {
        const info = state.runsInfo.get(n);
        if (!state.selected.includes(n) && !(info && info.offline)) feed.unfollow(n);
      }
      if (shownCount() !== shownBefore) feed.selectionChanged(); // (fewer runs: more points each)
    }
    if (table) table.render();
    changed();
  }

  function selectRun(name, on) {
    const list = state.selected.filter((n) => n !== name);
    if (on) list.push(name);
    state.view.runs = list;
    writeUrl();
    updateSelection();
  }

  function onlyDefault() {
    const total = state.runsInfo.size;
    return state.view.runs === null && total > L.DEFAULT_RUN_CAP ? { shown: L.DEFAULT_RUN_CAP, total } : null;
  }

  function loadedRuns() {
    return Array.from(state.runs.keys()).filter((n) => !(state.streams.get(n) && state.streams.get(n).loading));
  }

  /**
   * How long the board should still wait before its first draw: until every run shown at opening
   * has its history, at most FIRST_DRAW_HOLD_MS after the first one arrived (0: draw now).
   */
  function holdMs() {
    if (opened || state.mode !== "live") return 0;
    if (!listed) return 50; // the runs are not even listed yet
    const loaded = loadedRuns();
    const waiting = state.selected.filter((n) => state.runsInfo.has(n) && !loaded.includes(n));
    if (!waiting.length) {
      opened = true;
      return 0;
    }
    if (!loaded.length) return 50;
    if (!firstData) firstData = performance.now();
    const left = FIRST_DRAW_HOLD_MS - (performance.now() - firstData);
    if (left <= 0) opened = true;
    return Math.max(0, left);
  }

  // ---------------------------------------------------------------- drawing

  /** Something the reader sees changed (data loaded, view, selection): redraw soon. */
  function changed() {
    if (board) board.markDirty();
    renderStatus();
  }

  /**
   * Streamed records were applied: the board redraws at its streaming pace and the layers table
   * follows that redraw; the banner renders now (cheap unless its incidents changed), so an alarm is
   * news, or known, at the moment it arrives, not when the charts next draw (notifications).
   */
  function streamed() {
    if (board) board.markDirty(true);
    if (banner) banner.render(loadedRuns());
  }

  /** The banner, the layers table and the empty-page note. */
  function renderStatus() {
    if (banner) banner.render(loadedRuns());
    const shown = entries();
    A.renderLayers($("#layers"), shown);
    $("#empty").hidden = shown.some((e) => e.run.fields().length > 0);
  }

  /** After each redraw (`live`: one only the stream asked for, whose run-table refresh may wait). */
  function afterDraw(live) {
    if (table) table.refresh(live);
    // A chart expanded in the URL's view is where the reader is meant to look.
    if (state.view.expanded && !scrolledToExpanded && board.panels.has(state.view.expanded)) {
      scrolledToExpanded = true;
      board.panels.get(state.view.expanded).card.scrollIntoView({ block: "start" });
    }
    renderStatus();
    // A zoom from the URL is applied once the runs shown at opening have their data.
    if (state.pendingZoom && board.extent && board.extent.min !== null && state.selected.every((n) => !state.runsInfo.has(n) || loadedRuns().includes(n))) {
      const [a, b] = state.pendingZoom;
      state.pendingZoom = null;
      board.zoomTo(a, b);
    }
  }

  function onZoomEnd(zoom) {
    state.view.zoom = zoom ? [zoom.startValue, zoom.endValue] : null;
    writeUrl();
    if (feed) feed.onZoomEnd(zoom);
  }

  /** Zoom all charts around steps [a, b] of one run (an alarm's incident). */
  function zoomToSteps(name, a, b) {
    const run = state.runs.get(name);
    if (!run || !board) return;
    const first = run.firstStep || 1;
    const last = run.lastStep || b;
    const half = Math.max(10, Math.round((b - a) / 2), Math.round((last - first) * 0.01));
    const mode = state.view.xMode;
    const xa = L.xOf(run, Math.max(first, a - half), mode);
    const xb = L.xOf(run, Math.min(last, b + half), mode);
    if (Number.isFinite(xa) && Number.isFinite(xb)) board.zoomTo(xa, xb);
  }

  /** This chart's field(s) for each run at the hovered step (lib/tooltip.js). */
  function tooltip(params, panelId) {
    const card = board && board.panels.get(panelId);
    return L.tooltipHtml(params, { field: card ? card.panel.fields[0] : "", colorOf, smoothing: state.view.smoothing > 0 });
  }

  // ---------------------------------------------------------------- offline replay

  async function replayFiles(files) {
    for (const file of files) {
      try {
        replayText(file.name, await file.text());
      } catch (e) {
        setNotice("Could not read " + file.name + ": " + e.message, true);
      }
    }
  }

  /** Draw a whole metrics.jsonl given as text, as a run of its own. Returns the parse summary. */
  function replayText(fileName, text) {
    let name = "replay: " + fileName;
    for (let i = 2; state.runsInfo.has(name) && !state.runsInfo.get(name).offline; i++) name = "replay: " + fileName + " (" + i + ")";
    const res = feed.addText(name, text, "replay");
    if (!state.selected.includes(name)) state.view.runs = state.selected.concat([name]);
    let msg = "Replayed " + fileName + ": " + res.records + " records";
    if (res.skipped) msg += ", skipped " + res.skipped + " malformed line" + (res.skipped === 1 ? "" : "s") + (res.partial ? " (incl. a partial last line)" : "");
    setNotice(msg + ".", false);
    updateSelection();
    return res;
  }

  function loadExport() {
    const runs = Array.isArray(exportData.runs) ? exportData.runs : [];
    for (const r of runs) if (r && typeof r.name === "string" && typeof r.jsonl === "string") feed.addText(r.name, r.jsonl, null);
    const when = typeof exportData.created === "number" ? new Date(exportData.created * 1000).toLocaleString() : "";
    $("#conn").title = "A static export" + (when ? " made " + when : "") + ": no server, the runs as they were then.";
    updateSelection();
  }

  // ---------------------------------------------------------------- controls

  function renderConnection() {
    const pill = $("#conn");
    pill.textContent = { connecting: "connecting…", connected: "live", reconnecting: "reconnecting…", offline: "offline", export: "static export" }[state.connection] || state.connection;
    pill.className = "pill conn-" + state.connection;
    if (state.connection === "offline") pill.title = "Opened from disk: no server; drop a metrics.jsonl to replay it.";
  }

  function bindControls() {
    const xmode = $("#xmode");
    xmode.value = state.view.xMode;
    xmode.addEventListener("change", () => {
      state.view.xMode = xmode.value;
      board.resetZoom(); // a window in steps means nothing in seconds
      writeUrl();
      changed();
    });
    const slider = $("#smoothing");
    const out = $("#smoothing-value");
    slider.value = String(state.view.smoothing);
    out.textContent = state.view.smoothing.toFixed(2);
    let refetch = null;
    slider.addEventListener("input", () => {
      state.view.smoothing = Math.min(L.MAX_SMOOTHING, Number(slider.value));
      out.textContent = state.view.smoothing.toFixed(2);
      writeUrl();
      changed();
      clearTimeout(refetch);
      refetch = setTimeout(() => feed.smoothingChanged(), 250);
    });
    $("#file").addEventListener("change", (e) => {
      replayFiles(Array.from(e.target.files || []));
      e.target.value = "";
    });
    $("#reset-zoom").addEventListener("click", () => board.resetZoom());
    // Drag and drop a metrics.jsonl anywhere on the page.
    let depth = 0;
    window.addEventListener("dragenter", (e) => {
      e.preventDefault();
      depth++;
      document.body.classList.add("dragging");
    });
    window.addEventListener("dragleave", () => {
      depth = Math.max(0, depth - 1);
      if (!depth) document.body.classList.remove("dragging");
    });
    window.addEventListener("dragover", (e) => e.preventDefault());
    window.addEventListener("drop", (e) => {
      e.preventDefault();
      depth = 0;
      document.body.classList.remove("dragging");
      replayFiles(Array.from((e.dataTransfer && e.dataTransfer.files) || []));
    });
  }

  /** The runs shown that the server lists (what history requests are sized for). */
  function shownCount() {
    return state.selected.filter((n) => state.runsInfo.has(n)).length;
  }

  /** Points per history request: what the charts draw for the runs shown (lib/opening.js). */
  function historyPoints() {
    return L.historyPoints(board ? board.chartWidth() : 600, pointsParam, shownCount());
  }

  async function start() {
    board = new A.ChartBoard($("#charts"), {
      entries,
      settings: () => ({ xMode: state.view.xMode, smoothing: state.view.smoothing }),
      holdMs,
      panelView,
      tooltip,
      afterDraw,
      onZoomEnd,
      onPanelChange,
      onExport: (id, format) => exporter.exportChart(id, format).catch((e) => setNotice("Export failed: " + e.message, true)),
    });
    feed = new A.Feed(state, {
      token: parsed.other.filter(([k]) => k === "token").map(([, v]) => v)[0] || null,
      fullResMax: fullResParam,
      changed,
      streamed,
      setRunsInfo,
      indexingProgress,
      notice(text, isError) {
        listed = true; // (a failed run list must not hold the first draw)
        setNotice(text, isError);
      },
      historyPoints,
      namedRuns: () => state.view.runs,
      smoothing: () => state.view.smoothing,
      xMode: () => state.view.xMode,
      zoom: () => board.zoom,
      shown: () => entries().map((e) => e.run),
      onConnection(s) {
        state.connection = s;
        renderConnection();
      },
    });
    exporter = new A.Exporter({ board, entries, feed, settings: () => ({ xMode: state.view.xMode, smoothing: state.view.smoothing }), notice: setNotice });
    alarmDetail = new A.AlarmDetail($("#alarm-detail"));
    banner = new A.AlarmBanner($("#banner"), $("#notes"), $("#notify"), {
      entries, zoomToSteps, multiRun: () => entries().length > 1, showAlarm: (inc) => alarmDetail.show(inc),
    });
    table = new A.RunTable($("#runs-panel"), {
      infos: () => Array.from(state.runsInfo.values()),
      isSelected: (n) => state.selected.includes(n),
      colorOf,
      run: (n) => state.runs.get(n),
      filterText: () => state.view.filter,
      onToggle: selectRun,
      onFilter(text) {
        state.view.filter = text;
        writeUrl();
        table.render();
        changed();
      },
      onlyDefault,
      mode: state.mode,
    });
    bindControls();
    renderConnection();
    table.render();
    changed();
    if (state.exported) return loadExport();
    if (state.mode === "offline") {
      $("#empty").textContent = "Offline: no server. Drop a metrics.jsonl here, or choose one with “Open file…”.";
      return;
    }
    await feed.start();
  }

  // The page's state for tests and for the curious (read-only use): handle.js.
  root.gradmon = A.pageHandle({
    state,
    board: () => board,
    banner: () => banner,
    alarmDetail: () => alarmDetail,
    exporter: () => exporter,
    entries,
    loadedRuns,
    selectRun,
    replayText,
  });

  // Classic scripts at the end of <body>: the document may still be parsing.
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})(self);
