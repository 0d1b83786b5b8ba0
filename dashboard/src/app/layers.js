/* The latest `layers` record of each shown run, as a compact table under the charts. Browser only. */
(function (root) {
  "use strict";
  const L = root.GradmonLib;
  const A = root.GradmonApp;
  const el = A.el;
  const MAX_LAYER_ROWS = 10; // rows of each run's per-parameter table

  /** Redraw `box` for the shown entries ([{run, color}]); hidden when no run has a layers record. */
  function renderLayers(box, entries) {
    const shown = entries.filter((e) => e.run.layers);
    const key = shown.map((e) => e.run.name + "@" + e.run.layers.step + ":" + e.run.layersVersion).join(",");
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
      const wrap = el("div", "table-wrap");
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
      wrap.appendChild(table);
      card.append(title, wrap);
      const more = rec.top.length - rows.length;
      if (more > 0) card.appendChild(el("p", "hint", "+" + more + " more in the record"));
      box.appendChild(card);
    }
  }

  root.GradmonApp = root.GradmonApp || {};
  root.GradmonApp.renderLayers = renderLayers;
})(self);
