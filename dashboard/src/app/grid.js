/* Where the chart cards are: sections in order, cards in each section's grid, the hidden-chart
 * buttons, and which cards are near the viewport or changed size. What is drawn, and when, is the
 * board's (app/charts.js). Browser only. */
(function (root) {
  "use strict";
  const A = root.GradmonApp;
  const NEAR_PX = 300; // a card this close to the viewport counts as near (drawn)

  class CardGrid {
    /**
     * container: the element holding the sections. hooks: {panelView(id) -> {hidden, ...},
     * createCard(panel) -> ChartCard, showChart(id) (a hidden chart's button was clicked),
     * nearer() (a card came near the viewport)}.
     */
    constructor(container, hooks) {
      this.container = container;
      this.hooks = hooks;
      this.panels = new Map(); // id -> ChartCard (shown charts only; hidden ones have none)
      this.sections = new Map(); // id -> {el, head, title, grid, hiddenBox}
      // Charts are created and redrawn only near the viewport: a long dashboard costs what is seen.
      this.visibility = new IntersectionObserver((list) => this._onVisibility(list), { rootMargin: NEAR_PX + "px 0px" });
      this.resizeObserver = new ResizeObserver((list) => {
        for (const e of list) {
          const card = this.panels.get(e.target.parentElement && e.target.parentElement.dataset.panel);
          if (!card) continue;
          card.width = e.target.clientWidth; // read here, where layout is done (no forced layout in a draw)
          // The observer also reports each element once when it starts watching it, at the size
          // its chart was just created with: a resize then would draw that chart a second time.
          const c = card.chart;
          // ("auto": the element's size from now on, also for a chart created at a size given)
          if (c && (c.getWidth() !== card.width || c.getHeight() !== e.target.clientHeight)) c.resize({ width: "auto", height: "auto" });
        }
      });
    }

    /** Follow a card's chart element's size (once its chart exists). */
    observeSize(card) {
      this.resizeObserver.observe(card.el);
    }

    /** Sections and cards as `sections` ([{id, title, panels}]) and the view say: hidden charts get no card. */
    sync(sections) {
      const wantedSections = new Set(sections.map((s) => s.id));
      for (const [id, s] of this.sections) {
        if (wantedSections.has(id)) continue;
        s.el.remove();
        this.sections.delete(id);
      }
      const shown = new Set();
      let prevSection = null;
      for (const sec of sections) {
        const s = this._section(sec);
        const want = prevSection ? prevSection.el.nextSibling : this.container.firstChild;
        if (want !== s.el) this.container.insertBefore(s.el, want);
        prevSection = s;
        const hidden = [];
        let prev = null;
        for (const panel of sec.panels) {
          if (this.hooks.panelView(panel.id).hidden) {
            hidden.push(panel);
            continue;
          }
          shown.add(panel.id);
          const card = this.panels.get(panel.id) || this._addCard(panel, s.grid);
          card.panel = panel;
          const at = prev ? prev.card.nextSibling : s.grid.firstChild;
          if (at !== card.card) s.grid.insertBefore(card.card, at);
          prev = card;
        }
        this._hiddenList(s, hidden, sec.panels.length);
      }
      for (const [id, card] of this.panels) {
        if (shown.has(id)) continue;
        this.resizeObserver.unobserve(card.el);
        this.visibility.unobserve(card.card);
        card.dispose();
        this.panels.delete(id);
      }
      // New cards near the viewport are drawn in this pass (the observer reports a frame later).
      const near = window.innerHeight + NEAR_PX;
      for (const card of this.panels.values()) {
        if (card.visible !== null) continue;
        const r = card.card.getBoundingClientRect();
        card.visible = r.top < near && r.bottom > -NEAR_PX;
      }
    }

    _onVisibility(list) {
      let more = false;
      for (const e of list) {
        const card = this.panels.get(e.target.dataset.panel);
        if (!card) continue;
        if (e.isIntersecting && !card.visible) more = true;
        card.visible = e.isIntersecting;
      }
      if (more) this.hooks.nearer();
    }

    _addCard(panel, grid) {
      const card = this.hooks.createCard(panel);
      grid.appendChild(card.card);
      card.visible = null; // not known until laid out (see sync)
      this.panels.set(panel.id, card);
      this.visibility.observe(card.card);
      return card;
    }

    _section(sec) {
      let s = this.sections.get(sec.id);
      if (s) {
        s.title.textContent = sec.title;
        return s;
      }
      const el = A.el("section", "chart-section");
      el.dataset.section = sec.id;
      const head = A.el("div", "section-head");
      const title = A.el("h2", "section-title", sec.title);
      const hiddenBox = A.el("span", "hidden-charts");
      head.append(title, hiddenBox);
      const grid = A.el("div", "charts");
      el.append(head, grid);
      s = { el, head, title, grid, hiddenBox };
      this.sections.set(sec.id, s);
      return s;
    }

    /** "hidden: [zscore] [clip_coef]" in the section's head: a click shows the chart again. */
    _hiddenList(s, hidden, total) {
      const key = hidden.map((p) => p.id).join("|");
      if (s.hiddenBox.dataset.key === key) return;
      s.hiddenBox.dataset.key = key;
      s.hiddenBox.textContent = "";
      s.el.classList.toggle("all-hidden", hidden.length === total);
      if (!hidden.length) return;
      s.hiddenBox.appendChild(document.createTextNode("hidden:"));
      for (const p of hidden) {
        const b = A.el("button", "show-chart", p.title);
        b.type = "button";
        b.dataset.panel = p.id;
        b.title = "Show this chart again";
        b.addEventListener("click", () => this.hooks.showChart(p.id));
        s.hiddenBox.appendChild(b);
      }
    }
  }

  root.GradmonApp = root.GradmonApp || {};
  root.GradmonApp.CardGrid = CardGrid;
})(self);
