/* The dashboard page: runs list, data flow (history + WebSocket, or offline replay), banner. */
(function (root) {
  "use strict";
  const L = root.GradmonLib;
  const A = root.GradmonApp;
  // Distinct run colours; red is kept for spike and non-finite marks.
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#393b79"];
  const MAX_BANNER_ITEMS = 40;
  const MAX_LAYER_ROWS = 10; // rows of each run's per-parameter table

  const $ = (sel) => document.querySelector(sel);
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  const params = new URLSearchParams(location.search);
  const state = {
    mode: location.protocol === "file:" ? "offline" : "live",
    connection: location.protocol === "file:" ? "offline" : "connecting",
    runsInfo: new Map(), // name -> info from the server ({status, records, last_step, first_ts, ...}) or replay
    runs: new Map(), // name -> RunData of the selected runs
    selected: [], // names, in selection order
    colors: new Map(),
    userChoseRuns: false,
    loading: new Set(),
    reload: new Set(),
    settings: { xMode: "step", smoothing: 0, log: false },
    notice: "",
    fetches: 0,
    liveRecords: 0,
    droppedMessages: 0,
  };
  let client = null;
  let board = null;
  let nextColor = 0;

  function colorOf(name) {
    if (!state.colors.has(name)) state.colors.set(name, PALETTE[nextColor++ % PALETTE.length]);
    return state.colors.get(name);
  }

  function entries() {
    return state.selected.filter((n) => state.runs.has(n)).map((n) => ({ run: state.runs.get(n), color: colorOf(n) }));
  }

  function setNotice(text, isError) {
    state.notice = text;
    const n = $("#notice");
    n.textContent = text;
    n.className = isError ? "notice error" : "notice";
    n.hidden = !text;
  }

  // ---------------------------------------------------------------- runs list

  function newestRun() {
    let best = null;
    for (const info of state.runsInfo.values()) {
      const t = info.first_ts !== undefined && info.first_ts !== null ? info.first_ts : info.last_ts || 0;
      if (!best || t > best.t || (t === best.t && info.name > best.name)) best = { name: info.name, t };
    }
    return best && best.name;
  }

  function setRunsInfo(list) {
    const old = state.runsInfo;
    state.runsInfo = new Map();
    for (const r of list || []) state.runsInfo.set(r.name, r);
    for (const r of old.values()) {
      if (state.runsInfo.has(r.name)) continue;
      // Replays stay; a selected run whose file went away stays drawn, marked as such.
      if (r.status === "replay") state.runsInfo.set(r.name, r);
      else if (state.selected.includes(r.name)) state.runsInfo.set(r.name, Object.assign({}, r, { status: "removed" }));
    }
    for (const r of list || []) {
      const run = state.runs.get(r.name);
      // A run reset to an empty new file (gen null) is fetched again once it has lines.
      if (run && run.awaitingFile && r.cursor && r.cursor.gen) {
        run.awaitingFile = false;
        loadRun(r.name);
      }
    }
    if (!state.userChoseRuns && state.selected.length === 0) {
      const n = newestRun();
      if (n) selectRun(n, true, false);
    }
    renderRuns();
  }

  function renderRuns() {
    const ul = $("#runs");
    ul.textContent = "";
    const infos = Array.from(state.runsInfo.values()).sort((a, b) => (b.first_ts || 0) - (a.first_ts || 0) || (a.name < b.name ? -1 : 1));
    if (!infos.length) {
      ul.appendChild(el("li", "empty", state.mode === "offline" ? "No run loaded." : "No runs under the log directory yet."));
    }
    for (const info of infos) {
      const li = el("li", "run");
      li.dataset.run = info.name;
      const on = state.selected.includes(info.name);
      if (on) li.classList.add("selected");
      const box = el("input");
      box.type = "checkbox";
      box.checked = on;
      box.addEventListener("change", () => selectRun(info.name, box.checked, true));
      const sw = el("span", "swatch");
      sw.style.background = on ? colorOf(info.name) : "transparent";
      sw.style.borderColor = state.colors.get(info.name) || "#bbb";
      const name = el("span", "run-name", info.name);
      name.title = runTitle(info);
      const status = el("span", "status status-" + info.status, info.status);
      const meta = el("span", "run-meta", info.last_step !== undefined && info.last_step !== null ? "step " + info.last_step : "");
      const lab = el("label");
      lab.append(box, sw, name);
      li.append(lab, status, meta);
      ul.appendChild(li);
    }
  }

  function runTitle(info) {
    const h = info.header || {};
    const parts = [info.name];
    if (h.device) parts.push("device " + h.device + (h.mode ? " · " + h.mode : ""));
    if (h.max_norm !== undefined && h.max_norm !== null) parts.push("max_norm " + L.formatValue(L.decodeNumber(h.max_norm)));
    if (h.spike_mode) parts.push("spike_mode " + h.spike_mode);
    if (info.records !== undefined) parts.push(info.records + " records");
    if (info.malformed) parts.push(info.malformed + " malformed lines skipped");
    return parts.join("\n");
  }

  function selectRun(name, on, byUser) {
    if (byUser) state.userChoseRuns = true;
    const i = state.selected.indexOf(name);
    if (on && i < 0) {
      state.selected.push(name);
      colorOf(name);
      if (!state.runs.has(name)) loadRun(name);
    } else if (!on && i >= 0) {
      state.selected.splice(i, 1);
      if (state.runsInfo.get(name) && state.runsInfo.get(name).status !== "replay") {
        // Its memory goes; reselecting refetches. (The protocol has no unsubscribe: its records
        // keep coming and are ignored.)
        state.runs.delete(name);
      }
    }
    renderRuns();
    changed();
  }

  // ---------------------------------------------------------------- data flow

  function historyPoints() {
    return Math.max(200, Math.min(8000, Math.round(2 * (board ? board.chartWidth() : 600))));
  }

  async function loadRun(name) {
    if (state.mode !== "live") return;
    if (state.loading.has(name)) {
      state.reload.add(name); // a reset/lagged during the fetch: fetch again once it is done
      return;
    }
    const run = state.runs.get(name) || new L.RunData(name);
    state.runs.set(name, run);
    state.loading.add(name);
    try {
      state.fetches++;
      const resp = await client.history(name, { points: historyPoints() });
      if (state.runs.get(name) !== run) return; // deselected meanwhile
      run.loadHistory(resp, state.runsInfo.get(name));
      run.zoomKey = null;
    } catch (e) {
      setNotice("Could not load run " + name + ": " + e.message, true);
    } finally {
      state.loading.delete(name);
    }
    if (state.reload.delete(name)) return loadRun(name);
    subscribe(name);
    changed();
    if (board.zoom) onZoomEnd(board.zoom);
  }

  /**
   * Tell the server which runs to stream, each from the cursor up to which we have it complete
   * (all selected runs when `only` is not given). Records the server had queued before this
   * arrive with a `prev` beyond our cursor: they are dropped (see onRecords) until the catch-up.
   */
  function subscribe(only) {
    if (!client) return;
    const runs = {};
    for (const name of only ? [only] : state.selected) {
      const run = state.runs.get(name);
      if (run && !state.loading.has(name) && run.cursor) runs[name] = run.cursor;
    }
    if (!Object.keys(runs).length) return;
    if (client.send({ type: "subscribe", runs })) {
      for (const name of Object.keys(runs)) state.runs.get(name).subscribed = true;
    }
  }

  /** A `records` message: ingest it unless it starts beyond what we have (then resubscribe). */
  function onRecords(msg) {
    const run = state.runs.get(msg.run);
    if (!run || state.loading.has(msg.run) || !run.cursor) return; // the history fetch (then subscribe) covers it
    const prev = msg.prev;
    const cur = run.cursor;
    if (prev && cur && prev.gen === cur.gen && prev.offset > cur.offset) {
      // A gap: records queued for us before our subscribe (the catch-up resends them), or lost ones.
      state.droppedMessages++;
      if (!run.subscribed) subscribe(run.name);
      return;
    }
    if (prev && cur && prev.gen !== cur.gen) {
      loadRun(run.name); // another generation of the file: start over
      return;
    }
    run.subscribed = false; // in step again: a later gap means records were lost
    // prev < cursor: an overlap (resubscribe race); records merge by step, so nothing doubles.
    for (const r of msg.records || []) run.ingestRecord(r);
    if (msg.cursor && (!cur || msg.cursor.gen !== cur.gen || msg.cursor.offset > cur.offset)) run.cursor = msg.cursor;
    const info = state.runsInfo.get(msg.run);
    if (info && run.lastStep !== null) info.last_step = run.lastStep;
    state.liveRecords += (msg.records || []).length;
    changed();
  }

  function onMessage(msg) {
    switch (msg.type) {
      case "hello":
        setRunsInfo(msg.runs);
        for (const info of msg.runs || []) {
          const run = state.runs.get(info.name);
          // A server restart with a replaced file: our cursor is from another generation.
          if (run && run.cursor && info.cursor && info.cursor.gen !== run.cursor.gen && !state.loading.has(info.name)) {
            loadRun(info.name);
          }
        }
        for (const run of state.runs.values()) run.subscribed = false;
        subscribe();
        break;
      case "runs":
        setRunsInfo(msg.runs);
        break;
      case "records":
        onRecords(msg);
        break;
      case "reset": {
        const run = state.runs.get(msg.run);
        if (!run) break;
        if (msg.cursor && msg.cursor.gen === null) {
          // Truncated or replaced by a file with no complete line yet: empty until it has one.
          run.loadHistory({ cursor: null, exact: true });
          run.awaitingFile = true;
          changed();
        } else loadRun(msg.run);
        break;
      }
      case "lagged":
        if (state.runs.has(msg.run)) loadRun(msg.run); // records were dropped: refetch the history
        break;
      case "error":
        console.warn("gradmon server:", msg.error);
        break;
      default:
        break; // unknown messages are ignored (forward compatibility)
    }
  }

  function onConnection(s) {
    state.connection = s;
    renderConnection();
  }

  function renderConnection() {
    const pill = $("#conn");
    const text = {
      connecting: "connecting…",
      connected: "live",
      reconnecting: "reconnecting…",
      offline: "offline",
    }[state.connection] || state.connection;
    pill.textContent = text;
    pill.className = "pill conn-" + state.connection;
    pill.title = state.connection === "offline" ? "Opened from disk: no server; drop a metrics.jsonl to replay it." : "";
  }

  // ---------------------------------------------------------------- zoom refetch

  /** After a zoom gesture: fetch finer history for the visible step range of runs downsampled so far. */
  async function onZoomEnd(zoom) {
    if (state.mode !== "live") return;
    for (const { run } of entries()) {
      if (!zoom) {
        if (run.detail) run.setDetail(null);
        continue;
      }
      if (run.exact) continue; // the base already holds every step
      let a = zoom.startValue;
      let b = zoom.endValue;
      if (state.settings.xMode === "wall") {
        a = run.stepAtTs(a / 1000);
        b = run.stepAtTs(b / 1000);
      } else if (state.settings.xMode === "relative") {
        a = run.stepAtTs(a + run.startTime);
        b = run.stepAtTs(b + run.startTime);
      }
      if (!Number.isFinite(a) || !Number.isFinite(b)) continue;
      const start = Math.max(1, Math.floor(a));
      const end = Math.ceil(b);
      const key = start + ":" + end;
      if (run.zoomKey === key) continue;
      run.zoomKey = key;
      try {
        state.fetches++;
        const resp = await client.history(run.name, { points: historyPoints(), start, end });
        if (state.runs.get(run.name) !== run || run.zoomKey !== key) continue;
        run.setDetail(resp);
      } catch (e) {
        setNotice("Could not load detail of " + run.name + ": " + e.message, true);
      }
    }
    changed();
  }

  // ---------------------------------------------------------------- banner

  function bannerItems() {
    const items = [];
    for (const { run, color } of entries()) {
      for (const m of run.marksOf("spike")) items.push({ run: run.name, color, kind: "spike", step: m.step, value: m.value, mark: m });
      const nf = new Map();
      for (const m of run.marksOf("nonfinite")) {
        const e = nf.get(m.step) || { run: run.name, color, kind: "nonfinite", step: m.step, fields: [] };
        e.fields.push(m.field + "=" + L.formatValue(m.value));
        nf.set(m.step, e);
      }
      items.push(...nf.values());
      for (const ev of run.events) {
        if (ev.kind === "abort" || ev.kind === "io_error" || ev.kind === "history_overflow") {
          items.push({ run: run.name, color, kind: ev.kind, step: ev.step, message: ev.message });
        }
      }
    }
    return items.sort((a, b) => (a.step || 0) - (b.step || 0));
  }

  function renderBanner() {
    const banner = $("#banner");
    const items = bannerItems();
    const key = items.map((i) => i.run + i.kind + i.step).join(",");
    if (banner.dataset.key === key) return;
    banner.dataset.key = key;
    banner.textContent = "";
    banner.hidden = items.length === 0;
    if (!items.length) return;
    const nSpikes = items.filter((i) => i.kind === "spike").length;
    const nNonfinite = items.filter((i) => i.kind === "nonfinite").length;
    const other = items.length - nSpikes - nNonfinite;
    const parts = [];
    if (nSpikes) parts.push(nSpikes + (nSpikes === 1 ? " gradient-norm spike" : " gradient-norm spikes"));
    if (nNonfinite) parts.push(nNonfinite + (nNonfinite === 1 ? " non-finite step" : " non-finite steps"));
    if (other) parts.push(other + (other === 1 ? " event" : " events"));
    banner.appendChild(el("strong", "banner-title", "⚠ " + parts.join(" · ")));
    const list = el("div", "banner-items");
    // Show the most recent ones when there are many.
    const shown = items.slice(-MAX_BANNER_ITEMS);
    if (items.length > shown.length) list.appendChild(el("span", "more", "+" + (items.length - shown.length) + " earlier"));
    for (const it of shown) {
      const b = el("button", "mark mark-" + it.kind);
      b.type = "button";
      b.dataset.run = it.run;
      b.dataset.step = it.step;
      b.dataset.kind = it.kind;
      let text = "step " + it.step;
      if (it.kind === "spike") {
        text += " · ‖g‖ " + (it.value !== undefined ? L.formatValue(it.value) : "?");
        if (it.mark.median > 0 && Number.isFinite(it.value)) text += " (" + (it.value / it.mark.median).toFixed(1) + "× median)";
      } else if (it.kind === "nonfinite") {
        text += " · " + it.fields.join(", ");
      } else {
        text += " · " + it.kind;
      }
      if (state.selected.length > 1) text = it.run + " · " + text;
      b.textContent = text;
      b.title = it.kind === "spike" ? "flagged by " + it.mark.sources.join(", ") + " — click to zoom" : (it.message || "") + " — click to zoom";
      b.style.borderLeftColor = it.color;
      if (typeof it.step === "number") b.addEventListener("click", () => zoomToStep(it.run, it.step));
      list.appendChild(b);
    }
    banner.appendChild(list);
  }

  /** Zoom all charts around one step of one run. */
  function zoomToStep(name, step) {
    const run = state.runs.get(name);
    if (!run || !board) return;
    const first = run.firstStep || 1;
    const last = run.lastStep || step;
    const half = Math.max(10, Math.round((last - first) * 0.02));
    const mode = state.settings.xMode;
    const a = L.xOf(run, Math.max(first, step - half), mode);
    const b = L.xOf(run, Math.min(last, step + half), mode);
    if (!Number.isFinite(a) || !Number.isFinite(b)) return;
    board.zoomTo(a, b); // onZoomEnd follows once the gesture settles
  }

  // ---------------------------------------------------------------- layers table

  /** The latest `layers` record of each selected run, as a compact table (hidden when none). */
  function renderLayers() {
    const box = $("#layers");
    const shown = entries().filter((e) => e.run.layers);
    const key = shown.map((e) => e.run.name + "@" + e.run.layers.step + ":" + e.run.version).join(",");
    if (box.dataset.key === key) return;
    box.dataset.key = key;
    box.textContent = "";
    box.hidden = shown.length === 0;
    for (const { run, color } of shown) {
      const rec = run.layers;
      const card = el("section", "layers-card");
      card.dataset.run = run.name;
      card.dataset.step = rec.step;
      const title = el("h2", null, "Largest gradients · step " + rec.step + (shown.length > 1 ? " · " + run.name : ""));
      title.style.borderLeftColor = color;
      const table = el("table", "layers-table");
      const head = el("tr");
      for (const h of ["parameter", "grad norm", "param norm", "update ratio"]) head.appendChild(el("th", null, h));
      table.appendChild(head);
      const rows = L.layerRows(rec, MAX_LAYER_ROWS);
      for (const r of rows) {
        const tr = el("tr");
        tr.appendChild(el("td", "layer-name", r.name));
        for (const k of ["grad_norm", "param_norm", "update_ratio"]) {
          const td = el("td", "num", r[k]);
          if (/NaN|Infinity/.test(r[k])) td.classList.add("tt-bad");
          tr.appendChild(td);
        }
        table.appendChild(tr);
      }
      card.append(title, table);
      const more = rec.top.length - rows.length;
      if (more > 0) card.appendChild(el("p", "hint", "+" + more + " more in the record"));
      box.appendChild(card);
    }
  }

  // ---------------------------------------------------------------- tooltip

  function tooltip(params) {
    const list = Array.isArray(params) ? params : [params];
    const byRun = new Map();
    for (const p of list) {
      const data = Array.isArray(p.data) ? p.data : p.data && p.data.value;
      if (!data) continue;
      const runName = String(p.seriesId || "").split("|")[0];
      if (!byRun.has(runName)) byRun.set(runName, { step: data[2], marks: [] });
      if (p.data && p.data.nonfinite) byRun.get(runName).marks.push(p.data.field + " = " + p.data.nonfinite);
      if (p.data && p.data.spike) byRun.get(runName).marks.push("spike (" + p.data.spike.sources.join(", ") + ")");
    }
    const out = [];
    for (const [name, info] of byRun) {
      const run = state.runs.get(name);
      if (!run) continue;
      const step = info.step;
      const rows = [];
      for (const f of run.fields()) {
        const at = run.valueAt(f, step);
        if (!at || (!at.exact && f.startsWith("eval/"))) continue;
        const bad = typeof at.value === "number" && !Number.isFinite(at.value);
        rows.push(
          "<tr><td>" + esc(f) + "</td><td class='" + (bad ? "tt-bad" : "") + "'>" + (at.exact ? "" : "≈ ") + esc(L.formatField(f, at.value)) + "</td></tr>",
        );
      }
      const ts = run.tsAt(step);
      let head = "<b style='color:" + colorOf(name) + "'>" + esc(name) + "</b> · step " + step;
      if (Number.isFinite(ts)) head += " · " + new Date(ts * 1000).toLocaleTimeString();
      const marks = info.marks.length ? "<div class='tt-bad'>▲ " + info.marks.map(esc).join("<br>▲ ") + "</div>" : "";
      out.push("<div class='tt'>" + head + marks + "<table>" + rows.join("") + "</table></div>");
    }
    return out.join("");
  }

  function esc(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }

  // ---------------------------------------------------------------- offline replay

  async function replayFiles(files) {
    for (const file of files) {
      let text;
      try {
        text = await file.text();
      } catch (e) {
        setNotice("Could not read " + file.name + ": " + e.message, true);
        continue;
      }
      replayText(file.name, text);
    }
  }

  /** Draw a whole metrics.jsonl given as text, as a run of its own. Returns the parse summary. */
  function replayText(fileName, text) {
    const parsed = L.parseJsonl(text, { final: true });
    let name = "replay: " + fileName;
    for (let i = 2; state.runsInfo.has(name) && state.runsInfo.get(name).status !== "replay"; i++) name = "replay: " + fileName + " (" + i + ")";
    const run = new L.RunData(name);
    for (const r of parsed.records) run.ingestRecord(r);
    run.skippedLines += parsed.skipped;
    state.runs.set(name, run);
    const h = run.header || {};
    state.runsInfo.set(name, {
      name,
      status: "replay",
      records: parsed.records.length,
      last_step: run.lastStep,
      first_ts: Number.isFinite(run.startTime) ? run.startTime : Date.now() / 1000,
      header: h,
    });
    if (!state.selected.includes(name)) state.selected.push(name);
    colorOf(name);
    state.userChoseRuns = true;
    let msg = "Replayed " + fileName + ": " + parsed.records.length + " records";
    if (parsed.skipped) msg += ", skipped " + parsed.skipped + " malformed line" + (parsed.skipped === 1 ? "" : "s") + (parsed.partial ? " (incl. a partial last line)" : "");
    setNotice(msg + ".", false);
    renderRuns();
    changed();
    return { name, records: parsed.records.length, skipped: parsed.skipped, partial: parsed.partial };
  }

  // ---------------------------------------------------------------- wiring

  function changed() {
    if (board) board.markDirty();
    renderBanner();
    renderLayers();
    $("#empty").hidden = entries().some((e) => e.run.fields().length > 0);
  }

  function afterDraw() {
    renderBanner();
    // Keep the runs list's "step N" current without rebuilding it (a rebuild would eat clicks).
    for (const li of document.querySelectorAll("#runs li.run")) {
      const run = state.runs.get(li.dataset.run);
      const meta = li.querySelector(".run-meta");
      if (run && meta && run.lastStep !== null) meta.textContent = "step " + run.lastStep;
    }
    $("#empty").hidden = entries().some((e) => e.run.fields().length > 0);
  }

  function bindControls() {
    $("#xmode").addEventListener("change", (e) => {
      state.settings.xMode = e.target.value;
      board.resetZoom(); // a window in steps means nothing in seconds
      changed();
    });
    const slider = $("#smoothing");
    const out = $("#smoothing-value");
    slider.addEventListener("input", () => {
      state.settings.smoothing = Number(slider.value);
      out.textContent = Number(slider.value).toFixed(2);
      changed();
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

  async function start() {
    board = new A.ChartBoard($("#charts"), {
      entries,
      settings: state.settings,
      tooltip,
      afterDraw,
      onZoomEnd,
      onLogToggle(on) {
        state.settings.log = on;
        changed();
      },
    });
    bindControls();
    renderConnection();
    renderRuns();
    changed();
    if (state.mode === "offline") {
      $("#empty").textContent = "Offline: no server. Drop a metrics.jsonl here, or choose one with “Open file…”.";
      return;
    }
    client = new A.Client({ token: params.get("token"), onMessage, onState: onConnection });
    try {
      state.fetches++;
      const body = await client.runs();
      setRunsInfo(body.runs);
    } catch (e) {
      setNotice("Could not list runs: " + e.message, true);
    }
    client.connect();
  }

  // The page's state for tests and for the curious (read-only use).
  root.gradmon = {
    state,
    get board() {
      return board;
    },
    runs: () => Array.from(state.runsInfo.keys()),
    selected: () => state.selected.slice(),
    select: (name, on) => selectRun(name, on !== false, true),
    layers(run) {
      const r = state.runs.get(run);
      return r && r.layers ? { step: r.layers.step, rows: L.layerRows(r.layers, 0) } : null;
    },
    systemPoints(run, field) {
      const r = state.runs.get(run);
      const s = r && r.series.get("system/" + field);
      return s ? { steps: s.steps.slice(), values: s.values.slice() } : { steps: [], values: [] };
    },
    pointCount(run, field) {
      const r = state.runs.get(run);
      return r ? r.pointCount(field) : 0;
    },
    lastStep(run) {
      const r = state.runs.get(run);
      return r ? r.lastStep : null;
    },
    panels: () => (board ? Array.from(board.panels.keys()) : []),
    markers: (panel) => (board ? board.markers(panel) : []),
    spikes: () => bannerItems().filter((i) => i.kind === "spike").map((i) => ({ run: i.run, step: i.step, value: i.value })),
    renderCount: () => (board ? board.renderCount : 0),
    zoom: () => (board ? board.currentZoom() : null),
    replayText,
    setXMode(mode) {
      $("#xmode").value = mode;
      $("#xmode").dispatchEvent(new Event("change"));
    },
  };

  // Scripts are inserted by index.html's loader, possibly after DOMContentLoaded has fired.
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})(self);
