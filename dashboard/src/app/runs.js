/* The run table: tick runs to show them, a regex filter, status, steps, last loss/norm, and the
 * header's config flattened into columns (the ones that differ between runs first, highlighted).
 * Browser only; the logic is in lib/runtable.js. */
(function (root) {
  "use strict";
  const L = root.GradmonLib;
  const A = root.GradmonApp;
  const el = A.el;
  const LIVE_REFRESH_MS = 1000; // while streaming, the live cells change at most once a second

  class RunTable {
    /**
     * box: the runs panel element (holding #run-filter, #diff-only, #runs-table, .runs-count, .runs-note).
     * app: {infos() -> [info], isSelected(name), colorOf(name), run(name) -> RunData|undefined,
     * filterText(), onToggle(name, on), onFilter(text), onlyDefault() -> {shown, total} | null, mode}.
     */
    constructor(box, app) {
      this.box = box;
      this.app = app;
      this.table = box.querySelector("#runs-table");
      this.filterInput = box.querySelector("#run-filter");
      this.diffOnly = box.querySelector("#diff-only");
      this.count = box.querySelector(".runs-count");
      this.note = box.querySelector(".runs-note");
      this.refreshedAt = -Infinity;
      this.refreshTimer = 0;
      this.filterInput.value = app.filterText();
      this.filterInput.addEventListener("input", () => this.app.onFilter(this.filterInput.value));
      this.diffOnly.addEventListener("change", () => this.render());
    }

    render() {
      const infos = L.newestFirst(this.app.infos());
      const filter = L.runFilter(this.app.filterText());
      this.filterInput.classList.toggle("invalid", !!filter.error);
      this.filterInput.title = filter.error ? "Not a regular expression: " + filter.error : "Regular expression on run names (case-insensitive)";
      const visible = infos.filter((i) => filter.test(i.name));
      const rows = visible.map((i) => ({ name: i.name, config: L.flattenConfig(i.header && i.header.config) }));
      let cols = L.configColumns(rows);
      if (this.diffOnly.checked) cols = cols.filter((c) => c.differs);
      const thead = el("thead");
      const hr = el("tr");
      for (const h of ["", "run", "status", "steps", "loss", "grad norm"]) hr.appendChild(el("th", null, h));
      for (const c of cols) {
        const th = el("th", c.differs ? "cfg differs" : "cfg", c.key);
        th.title = c.differs ? "config." + c.key + ": differs between the runs listed" : "config." + c.key;
        hr.appendChild(th);
      }
      thead.appendChild(hr);
      const tbody = el("tbody");
      if (!visible.length) {
        const tr = el("tr", "empty");
        const td = el("td", null, infos.length ? "No run matches the filter." : this.app.mode === "live" ? "No runs under the log directory yet." : "No run loaded.");
        td.colSpan = 6 + cols.length;
        tr.appendChild(td);
        tbody.appendChild(tr);
      }
      for (let k = 0; k < visible.length; k++) tbody.appendChild(this._row(visible[k], rows[k].config, cols));
      this.table.textContent = "";
      this.table.append(thead, tbody);
      const shown = visible.filter((i) => this.app.isSelected(i.name)).length;
      this.count.textContent = infos.length + (infos.length === 1 ? " run" : " runs") + " · " + shown + " shown" + (visible.length < infos.length ? " · " + visible.length + " match" : "");
      const capped = this.app.onlyDefault();
      this.note.hidden = !capped;
      if (capped) this.note.textContent = "Showing the " + capped.shown + " newest of " + capped.total + " runs: tick others to add them.";
      this.refresh();
    }

    _row(info, config, cols) {
      const tr = el("tr", "run");
      tr.dataset.run = info.name;
      const on = this.app.isSelected(info.name);
      if (on) tr.classList.add("selected");
      const td0 = el("td", "pick");
      const box = el("input");
      box.type = "checkbox";
      box.checked = on;
      box.setAttribute("aria-label", "show " + info.name);
      box.addEventListener("change", () => this.app.onToggle(info.name, box.checked));
      const sw = el("span", "swatch");
      sw.style.background = on ? this.app.colorOf(info.name) : "transparent";
      sw.style.borderColor = on ? this.app.colorOf(info.name) : "";
      td0.append(box, sw);
      const name = el("td", "run-name", info.name);
      name.title = runTitle(info);
      name.addEventListener("click", () => this.app.onToggle(info.name, !this.app.isSelected(info.name)));
      const status = el("td", "run-status");
      status.appendChild(el("span"));
      setStatus(status.firstChild, info);
      tr.append(td0, name, status, el("td", "num steps"), el("td", "num last-loss"), el("td", "num last-norm"));
      for (const c of cols) {
        const td = el("td", c.differs ? "cfg differs" : "cfg", L.configText(config[c.key]));
        tr.appendChild(td);
      }
      return tr;
    }

    /**
     * Update the live cells (steps, last loss and norm) without rebuilding the table (a rebuild would
     * eat clicks). `live`: asked after a redraw only the stream caused; then at most once per
     * LIVE_REFRESH_MS (the last values follow within that time).
     */
    refresh(live) {
      const now = performance.now();
      if (live && now - this.refreshedAt < LIVE_REFRESH_MS) {
        if (!this.refreshTimer) this.refreshTimer = setTimeout(() => this.refresh(), LIVE_REFRESH_MS - (now - this.refreshedAt));
        return;
      }
      clearTimeout(this.refreshTimer);
      this.refreshTimer = 0;
      this.refreshedAt = now;
      const infos = new Map(this.app.infos().map((i) => [i.name, i]));
      for (const tr of this.table.querySelectorAll("tr.run")) {
        const name = tr.dataset.run;
        const run = this.app.run(name);
        const info = infos.get(name);
        if (info) setStatus(tr.querySelector(".run-status > span"), info); // (a run being read: how far)
        const last = run && run.lastStep !== null ? run.lastStep : info && info.last_step !== undefined ? info.last_step : null;
        setText(tr.querySelector(".steps"), last === null || last === undefined ? "—" : String(last));
        setText(tr.querySelector(".last-loss"), run ? L.formatValue(run.lastValue("loss")) : "—");
        setText(tr.querySelector(".last-norm"), run ? L.formatValue(run.lastValue("grad_norm")) : "—");
      }
    }
  }

  function setText(node, text) {
    if (node && node.textContent !== text) node.textContent = text;
  }

  /** The status badge of a run (lib/runstatus.js), changed only where it differs. */
  function setStatus(span, info) {
    if (!span) return;
    const s = L.runStatus(info);
    const cls = "status status-" + s.cls;
    if (span.className !== cls) span.className = cls;
    setText(span, s.text);
    if (span.title !== s.title) span.title = s.title;
  }

  function runTitle(info) {
    const h = info.header || {};
    const parts = [info.name];
    if (h.device) parts.push("device " + h.device + (h.mode ? " · " + h.mode : ""));
    if (h.max_norm !== undefined && h.max_norm !== null) parts.push("max_norm " + L.formatValue(L.decodeNumber(h.max_norm)));
    if (h.spike_mode) parts.push("spike_mode " + h.spike_mode);
    if (info.records !== undefined) parts.push(info.records + " records");
    if (info.malformed) parts.push(info.malformed + " malformed lines skipped");
    return parts.join("\n") + "\nClick to show or hide";
  }

  root.GradmonApp = root.GradmonApp || {};
  root.GradmonApp.RunTable = RunTable;
})(self);
