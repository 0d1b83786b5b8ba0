/* The alarm detail view: the forensics of one alarm (lib/forensics.js) in a panel fixed beside the
 * charts, so it stays in view at every zoom and scroll. Opened from the alarm's banner line (which
 * also zooms the charts to the incident); closed by its button or Escape. Browser only. */
(function (root) {
  "use strict";
  const L = root.GradmonLib;
  const A = root.GradmonApp;
  const el = A.el;

  class AlarmDetail {
    /** box: the (empty) aside element. */
    constructor(box) {
      this.box = box;
      this.shown = null; // {run, step, reason, view}
      root.addEventListener("keydown", (e) => {
        if (e.key === "Escape" && this.shown) this.hide();
      });
    }

    /** Show incident `inc` (lib/alarms.js incidentsOf: its `alarm` event carries the forensics). */
    show(inc) {
      const view = L.forensicsView(inc.alarm);
      this.shown = { run: inc.run, step: inc.start, reason: inc.reason, view };
      const box = this.box;
      box.textContent = "";
      box.dataset.run = inc.run;
      box.dataset.step = inc.start;
      const head = el("div", "detail-head");
      const title = el("h2", null, L.reasonTitle(inc.reason) + " · step " + inc.start);
      title.style.borderLeftColor = inc.color || "";
      const close = el("button", "detail-close", "×");
      close.type = "button";
      close.title = "Close (Esc)";
      close.setAttribute("aria-label", "Close the alarm details");
      close.addEventListener("click", () => this.hide());
      head.append(title, close);
      box.appendChild(head);
      box.appendChild(el("p", "detail-run", inc.run));
      if (inc.message) box.appendChild(el("p", "detail-message", inc.message));
      if (!view) {
        box.appendChild(el("p", "hint", "No forensics in this alarm: MonitoredTrainStep(..., forensics=K) keeps the last K steps' per-layer and per-rank norms for it."));
      } else {
        if (view.layers.length) box.appendChild(this._layers(view));
        if (view.ranks.length > 1) box.appendChild(this._ranks(view));
        if (view.samples.length) box.appendChild(this._samples(view));
        if (view.note) box.appendChild(el("p", "hint detail-note", view.note));
      }
      box.hidden = false;
    }

    hide() {
      this.shown = null;
      this.box.hidden = true;
      this.box.textContent = "";
    }

    _layers(view) {
      const sec = el("section", "detail-layers");
      sec.appendChild(el("h3", null, (view.grouped ? "Gradient norm by group" : "Gradient norm by layer") + " · step " + view.step));
      const list = el("ol", "bar-list");
      for (const row of view.layers) {
        const li = el("li", "bar-row" + (row.nonfinite ? " tt-bad" : ""));
        li.dataset.name = row.name;
        const name = el("span", "bar-name", row.name);
        name.title = row.name;
        const track = el("span", "bar-track");
        const bar = el("span", "bar");
        bar.style.width = (100 * row.frac).toFixed(1) + "%";
        track.appendChild(bar);
        li.append(name, track, el("span", "num", L.formatValue(row.value)));
        list.appendChild(li);
      }
      sec.appendChild(list);
      if (view.moreLayers > 0) sec.appendChild(el("p", "hint", "+" + view.moreLayers + " smaller"));
      return sec;
    }

    _ranks(view) {
      const sec = el("section", "detail-ranks");
      sec.appendChild(el("h3", null, "Each rank's own norm"));
      const strip = el("div", "rank-strip");
      for (const r of view.ranks) {
        const cell = el("span", "rank-cell" + (r.top ? " top" : "") + (r.nonfinite ? " tt-bad" : ""));
        cell.dataset.rank = r.rank;
        // Shade by the share of the largest: the spiking rank stands out at any rank count.
        cell.style.setProperty("--share", String(Math.max(0.06, r.frac)));
        cell.title = "rank " + r.rank + ": " + L.formatValue(r.value);
        cell.append(el("span", "rank-id", String(r.rank)), el("span", "num", L.formatValue(r.value)));
        strip.appendChild(cell);
      }
      sec.appendChild(strip);
      if (view.topRank !== null) sec.appendChild(el("p", "detail-top-rank", "Largest: rank " + view.topRank));
      return sec;
    }

    _samples(view) {
      const sec = el("section", "detail-samples");
      sec.appendChild(el("h3", null, "Sample ids of the step"));
      for (const s of view.samples) {
        const p = el("p", "sample-ids" + (s.top ? " top" : ""));
        p.dataset.rank = s.rank;
        if (view.samples.length > 1) p.appendChild(el("span", "sample-rank", "rank " + s.rank + ": "));
        p.appendChild(el("code", null, s.text));
        sec.appendChild(p);
      }
      return sec;
    }
  }

  root.GradmonApp = root.GradmonApp || {};
  root.GradmonApp.AlarmDetail = AlarmDetail;
})(self);
