/* Ascent web UI: live charts (uPlot), the live log tail (server-sent events), small helpers.
   Pages are server-rendered; htmx does the partial updates; this file only adds what needs
   script: charts and the log stream. Nothing here writes to the console on expected failures. */
(function () {
  "use strict";

  const PALETTE = ["#2b5fd9", "#d9480f", "#2f9e44", "#ae3ec9", "#f08c00", "#0c8599", "#e64980", "#5c940d"];
  const TERMINAL = ["SUCCEEDED", "FAILED", "CANCELLED"];

  async function getJSON(url) {
    const response = await fetch(url, {headers: {Accept: "application/json"}, credentials: "same-origin"});
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(body.detail || body.error || `HTTP ${response.status}`);
    return body;
  }

  /* series: [{label, points: [[step, value], ...]}] -> uPlot data aligned on the union of steps */
  function align(series) {
    const steps = [...new Set(series.flatMap(s => s.points.map(p => p[0])))].sort((a, b) => a - b);
    const index = new Map(steps.map((s, i) => [s, i]));
    const columns = series.map(s => {
      const column = new Array(steps.length).fill(null);
      s.points.forEach(p => { column[index.get(p[0])] = p[1]; });
      return column;
    });
    return [steps, ...columns];
  }

  const STEP_INCREMENTS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1e3, 2e3, 2.5e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6];

  /* The y range: uPlot's own, except for a flat series, which it would stretch to 0–100 (a
     reward of 0 at every step): 0–1 for zeros, 10 % either side otherwise. */
  function yRange(u, min, max) {
    if (min === null || max === null) return [0, 1];
    if (min === max) return min === 0 ? [0, 1] : [min - Math.abs(min) * 0.1, max + Math.abs(max) * 0.1];
    return uPlot.rangeNum(min, max, 0.1, true);
  }

  /* Tick labels with as many decimals as the tick spacing needs (tiny KLs, flat entropies). */
  function ticks(u, splits) {
    if (splits.length < 2) return splits.map(v => String(v));
    const step = Math.abs(splits[1] - splits[0]) || 1;
    const big = Math.max(...splits.map(Math.abs));
    if (big !== 0 && (big < 1e-3 || big >= 1e6)) {
      const digits = Math.max(0, Math.min(3, Math.ceil(Math.log10(big / step))));
      return splits.map(v => (v === 0 ? "0" : v.toExponential(digits)));
    }
    const decimals = Math.max(0, Math.min(8, -Math.floor(Math.log10(step))));
    return splits.map(v => v.toFixed(decimals));
  }

  const short = v => (v === null || v === undefined ? "—" : String(Number(v.toPrecision(4))));

  /* What a chart shows, as text: each series' last value, minimum and maximum (the summary,
     also the plot's accessible name), and every point in a table (the "Table view"). */
  function describe(box, shown, data) {
    const plot = box.querySelector(".plot");
    const title = (box.querySelector("h3") || {}).textContent || "Metric";
    const summary = shown.map(s => {
      const values = s.points.map(p => p[1]);
      const last = s.points[s.points.length - 1];
      return `${s.label}: last ${short(last[1])} at step ${last[0]}, min ${short(Math.min(...values))}, ` +
        `max ${short(Math.max(...values))} (${s.points.length} step${s.points.length === 1 ? "" : "s"})`;
    }).join("; ");
    if (plot && plot.hasAttribute("role")) plot.setAttribute("aria-label", shown.length ? `${title} chart: ${summary}` : "No values yet");
    const line = box.querySelector("[data-chart-summary]");
    if (line) line.textContent = summary;
    const holder = box.querySelector("[data-chart-table]");
    if (!holder) return;
    const table = document.createElement("table");
    const head = table.createTHead().insertRow();
    [box.dataset.xlabel || "step", ...shown.map(s => s.label)].forEach(text => {
      const th = document.createElement("th"); th.textContent = text; th.scope = "col"; head.appendChild(th);
    });
    const body = table.createTBody();
    (data[0] || []).forEach((step, i) => {
      const row = body.insertRow();
      [step, ...data.slice(1).map(column => column[i])].forEach((value, j) => {
        const cell = row.insertCell(); cell.className = "num"; cell.textContent = j ? short(value) : String(value);
      });
    });
    holder.replaceChildren(table);
  }

  /* Draw (or redraw) one chart in `box` (.chart element); sets box.dataset.points. */
  function draw(box, series) {
    const plot = box.querySelector(".plot");
    const shown = series.filter(s => s.points.length);
    box.dataset.points = String(shown.reduce((n, s) => n + s.points.length, 0));
    describe(box, shown, shown.length ? align(shown) : []);
    if (!shown.length || typeof uPlot === "undefined") {
      plot.innerHTML = '<div class="none">No values yet</div>';
      box._uplot = null;
      return;
    }
    const data = align(shown);
    const labels = shown.map(s => s.label).join("|");
    const latest = u => u.setLegend({idx: u.data[0].length - 1});  // the legend's values when not hovered
    if (box._uplot && box._labels === labels) { box._uplot.setData(data); latest(box._uplot); return; }
    if (box._uplot) box._uplot.destroy();
    plot.innerHTML = "";
    box._labels = labels;
    box._uplot = new uPlot({
      width: Math.max(Math.min(plot.clientWidth || box.clientWidth - 16, window.innerWidth - 48), 240), height: 200,
      scales: {x: {time: false}, y: {range: yRange}},
      // steps are whole numbers: no ticks between them
      axes: [{label: box.dataset.xlabel || "step", incrs: STEP_INCREMENTS}, {size: 64, values: ticks}],
      cursor: {drag: {x: true, y: false}},
      hooks: {setCursor: [u => { if (u.cursor.idx === null || u.cursor.idx === undefined) latest(u); }]},
      series: [{label: box.dataset.xlabel || "step"}, ...shown.map((s, i) => ({
        label: s.label, stroke: PALETTE[i % PALETTE.length], width: 1.6, spanGaps: true,
        points: {show: s.points.length < 40},
      }))],
    }, data, plot);
    latest(box._uplot);
  }

  /* A run whose reward stayed exactly 0 for many logged steps gets a hint: the model never
     produced a rewarded answer, so the gradient is zero and nothing is learned. */
  function zeroRewardHint(points) {
    const hint = document.getElementById("zero-reward");
    if (!hint) return;
    const after = Number(hint.dataset.steps);
    const stuck = points.length >= after && points.every(p => p[1] === 0);
    hint.hidden = !stuck;
    if (stuck) hint.querySelector("[data-count]").textContent = String(points.length);
  }

  /* --- a run's page: charts of its metrics, refreshed while it is active -------------------- */
  function runCharts(root) {
    const note = document.getElementById("metrics-note");
    const boxes = [...root.querySelectorAll(".chart")];
    const url = root.dataset.metricsUrl;
    const state = () => (document.getElementById("run-status") || {dataset: {}}).dataset.state;
    let last = false;

    async function refresh() {
      try {
        const index = await getJSON(url);
        const keysOf = box => box.dataset.keys.split(",").flatMap(k =>
          k.endsWith("/*") ? index.keys.filter(n => n.startsWith(k.slice(0, -1))) : index.keys.includes(k) ? [k] : []);
        const wanted = [...new Set(boxes.flatMap(keysOf))];
        const history = wanted.length
          ? (await getJSON(`${url}?keys=${encodeURIComponent(wanted.join(","))}&max_points=500`)).history : {};
        const ended = TERMINAL.includes(state());
        boxes.forEach(box => {
          const keys = keysOf(box);
          box.hidden = ended && !keys.length;  // nothing of it was logged, and nothing will be
          draw(box, keys.map(k => ({label: k, points: history[k] || []})));
        });
        root.dataset.loaded = "true";
        const empty = document.querySelector("[data-no-metrics]");
        if (empty) empty.hidden = !(ended && boxes.every(box => box.hidden));
        zeroRewardHint(history["reward/mean"] || []);
        if (note) {
          note.innerHTML = "";
          if (index.mlflow_url) {
            const link = document.createElement("a");
            link.href = index.mlflow_url; link.target = "_blank"; link.rel = "noopener";
            link.textContent = "Open in MLflow";
            note.appendChild(link);
          } else {
            note.textContent = "No metrics logged yet";
          }
        }
      } catch (error) {
        if (note) note.textContent = `Metrics unavailable: ${error.message}`;
      }
      if (TERMINAL.includes(state())) {
        if (!last) { last = true; setTimeout(refresh, 1500); }  // values logged just before the end
        return;
      }
      setTimeout(refresh, 4000);
    }
    refresh();
  }

  /* --- a run's page: the log tail, streamed as server-sent events ------------------------- */
  function logTail(pre) {
    const status = document.getElementById("log-state");
    let attempt = null, offset = 0, source = null, ended = false, retryMs = 3000;
    const MAX = 200000;

    const ANSI = /\u001b\[[0-9;?]*[A-Za-z]/g;  // colour codes of Ray's log prefixes

    // the search box shows only the lines that hold its text (in a second pane, so the full log
    // keeps streaming underneath)
    const search = document.getElementById("log-search");
    const matches = document.getElementById("log-matches");
    function filter() {
      if (!search || !matches) return;
      const needle = search.value.trim().toLowerCase();
      pre.hidden = Boolean(needle);
      matches.hidden = !needle;
      if (!needle) return;
      const lines = pre.textContent.split("\n").filter(line => line.toLowerCase().includes(needle));
      matches.textContent = lines.length ? lines.join("\n") : `No line holds “${search.value.trim()}”.`;
      matches.dataset.count = String(lines.length);
    }
    if (search) search.addEventListener("input", filter);

    function append(text) {
      text = text.replace(ANSI, "");
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
      let content = pre.textContent + text;
      if (content.length > MAX) content = "…" + content.slice(-MAX);
      pre.textContent = content;
      if (atBottom) pre.scrollTop = pre.scrollHeight;
      filter();
    }

    function open() {
      const params = new URLSearchParams({follow: "1", offset: String(offset)});
      if (attempt !== null) params.set("attempt", String(attempt));
      source = new EventSource(`${pre.dataset.url}?${params}`);
      source.onopen = () => { retryMs = 3000; if (status) status.textContent = "live"; };
      source.addEventListener("log", event => {
        const data = JSON.parse(event.data);
        if (attempt !== null && data.attempt !== attempt) append(`\n──── attempt ${data.attempt} ────\n`);
        attempt = data.attempt; offset = data.offset;
        append(data.text);
      });
      source.addEventListener("end", event => {
        const data = JSON.parse(event.data);
        source.close();
        if (TERMINAL.includes(data.state)) {
          ended = true;
          if (status) status.textContent = `ended (${data.state.toLowerCase()})`;
          pre.dataset.ended = "true";
        } else {
          setTimeout(open, 500);  // the server ends long streams; carry on from the offset
        }
      });
      source.onerror = () => {
        // A refused stream (429: too many open) or a broken one: back off, doubling up to a minute.
        source.close();
        if (!ended) {
          if (status) status.textContent = "reconnecting…";
          setTimeout(open, retryMs);
          retryMs = Math.min(retryMs * 2, 60000);
        }
      };
    }
    open();
  }

  /* --- the compare page: one chart per chosen metric, a series per run (data in the page) -- */
  function compareCharts(root) {
    root.querySelectorAll(".chart").forEach(box => {
      draw(box, JSON.parse(box.querySelector("script[type='application/json']").textContent));
    });
    root.dataset.loaded = "true";
    changedOnly(document.getElementById("diff-only"), document.querySelector("table.diff"));
  }

  /* A checkbox that hides a table's unchanged rows (`tr.same`) while it is ticked. */
  function changedOnly(checkbox, table) {
    if (!checkbox || !table) return;
    const apply = () => table.classList.toggle("only-changed", checkbox.checked);
    checkbox.addEventListener("change", apply);
    apply();
  }

  /* --- the precision comparison: the error curves, diverged rows only, the first in view ---- */
  function precisionPage() {
    const box = document.querySelector("[data-testid='precision-curves']");
    if (box) {
      draw(box, JSON.parse(document.getElementById("precision-curves-data").textContent));
      box.dataset.loaded = "true";
    }
    changedOnly(document.getElementById("diverged-only"), document.querySelector("table.precision-rows"));
    const row = document.getElementById("first-divergence-row");
    if (row) row.scrollIntoView({block: "center"});
  }

  /* On a phone the navigation folds behind the Menu button. */
  function menuToggle() {
    const button = document.querySelector(".menu-toggle");
    if (!button) return;
    button.addEventListener("click", () => {
      const open = button.closest(".topbar").classList.toggle("open");
      button.setAttribute("aria-expanded", String(open));
    });
  }

  function copyButtons() {
    document.querySelectorAll("[data-copy]").forEach(button => button.addEventListener("click", () => {
      const text = document.querySelector(button.dataset.copy).textContent.trim();
      const label = button.textContent;
      const say = (words) => { button.textContent = words; setTimeout(() => { button.textContent = label; }, 1500); };
      if (navigator.clipboard) navigator.clipboard.writeText(text).then(() => say("Copied"), () => say("Copy refused: select the text"));
      else say("Select the text to copy");
    }));
  }

  /* The submit form's idempotency key survives the back button: a browser that reloads the page
     on "back" gets a new form from the server but restores what was typed, so the key of the
     form last sent from this address is put back too, and the server answers with the run that
     form already made instead of queueing a second one. */
  function keepFormKey(form) {
    const input = form.querySelector('input[name="key"]');
    if (!input) return;
    const slot = `ascent:form-key:${location.pathname}${location.search}`;
    const navigation = performance.getEntriesByType("navigation")[0];
    try {
      const saved = sessionStorage.getItem(slot);
      if (saved && navigation && navigation.type === "back_forward") input.value = saved;
      form.addEventListener("submit", () => sessionStorage.setItem(slot, input.value));
    } catch (error) { /* storage disabled: the server-side key still guards double clicks */ }
  }

  /* Widths of bars from their data-pct (set through CSSOM: the Content-Security-Policy refuses
     style attributes in the HTML). Runs on the page and on each fragment htmx swaps in. */
  function barWidths(root) {
    root.querySelectorAll("[data-pct]").forEach(el => { el.style.width = `${Number(el.dataset.pct) || 0}%`; });
  }

  /* Forms that ask before sending (data-confirm) or are sent once (data-send-once); listened for
     on the document, so forms in fragments htmx swaps in are covered too. */
  document.addEventListener("submit", event => {
    const form = event.target;
    if (form.dataset.confirm && !confirm(form.dataset.confirm)) { event.preventDefault(); return; }
    if (form.hasAttribute("data-send-once")) {
      if (form.dataset.sent) { event.preventDefault(); return; }
      form.dataset.sent = "1";
    }
  });
  document.addEventListener("htmx:load", event => barWidths(event.target));

  /* A page restored by the back button may be sent again: the server then answers with the run
     that form already made (each form carries its own idempotency key). */
  window.addEventListener("pageshow", event => {
    if (event.persisted) document.querySelectorAll("form[data-sent]").forEach(f => { delete f.dataset.sent; });
  });

  document.addEventListener("DOMContentLoaded", () => {
    const charts = document.getElementById("charts");
    if (charts) runCharts(charts);
    const log = document.getElementById("log");
    if (log) logTail(log);
    const compare = document.getElementById("compare-charts");
    if (compare) compareCharts(compare);
    if (document.getElementById("precision-rows-box") || document.getElementById("precision-charts")) precisionPage();
    copyButtons();
    menuToggle();
    barWidths(document);
    const submitForm = document.getElementById("submit-form");
    if (submitForm) keepFormKey(submitForm);
  });
})();
