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

  /* series: [{label, points: [[x, value], ...]}] -> uPlot data aligned on the union of the xs */
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
  // seconds: 1 s … 1 day
  const TIME_INCREMENTS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];

  /* Seconds as m:ss or h:mm:ss (a wall-clock axis counts from the run's first logged value). */
  function clock(seconds) {
    const total = Math.round(seconds), h = Math.floor(total / 3600), m = Math.floor(total % 3600 / 60), sec = total % 60;
    const pad = n => String(n).padStart(2, "0");
    return h ? `${h}:${pad(m)}:${pad(sec)}` : `${m}:${pad(sec)}`;
  }

  /* The y range: uPlot's own, except for a flat series, which it would stretch to 0–100 (a
     reward of 0 at every step): 0–1 for zeros, 10 % either side otherwise. */
  function yRange(u, min, max) {
    if (min === null || max === null) return [0, 1];
    if (min === max) return min === 0 ? [0, 1] : [min - Math.abs(min) * 0.1, max + Math.abs(max) * 0.1];
    return uPlot.rangeNum(min, max, 0.1, true);
  }

  function logRange(u, min, max) {
    if (min === null || max === null) return [0.1, 1];
    return uPlot.rangeLog(min, max, 10, true);
  }

  /* Tick labels with as many decimals as the tick spacing needs (tiny KLs, flat entropies). */
  function ticks(u, splits) {
    if (u.scales.y.distr === 3) return splits.map(v => (v === null ? "" : short(v)));  // log: 0.01, 0.1, 1
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

  /* --- how charts are drawn: smoothing, log scale, step or wall-clock axis ------------------
     A page's chart controls ([data-chart-controls]) set these for the charts inside the same
     [data-chart-view] element, and are remembered in this browser; charts elsewhere (the
     precision page's error curves) are drawn plainly. A chart with data-x="time" (the node's
     resources, which have no training step) always counts time. */
  const VIEW_KEY = "ascent:chart-view";
  const PLAIN = {smoothing: 0, log: false, x: "step"};
  const saved = (() => { try { return JSON.parse(localStorage.getItem(VIEW_KEY)) || {}; } catch (error) { return {}; } })();
  const view = {...PLAIN, ...saved};

  function viewOf(box) {
    const chosen = box.closest("[data-chart-view]") ? view : PLAIN;
    return {...chosen, x: box.dataset.x || chosen.x};
  }

  /* Exponential moving average, debiased as TensorBoard does (early points are not pulled
     towards 0); gaps stay gaps. */
  function smooth(values, weight) {
    let last = 0, n = 0;
    return values.map(v => {
      if (v === null || v === undefined) return null;
      n += 1;
      last = last * weight + (1 - weight) * v;
      return last / (1 - Math.pow(weight, n));
    });
  }

  /* [step, value, time ms] points -> [x, value]: the step, or seconds since `t0` (the series'
     own first point unless the page gives one). Points without a time keep their step. */
  function onAxis(series, x, t0) {
    return series.map(s => {
      const start = t0 ?? (s.points.length && s.points[0][2] !== undefined ? s.points[0][2] : null);
      const timed = x === "time" && start !== null;
      return {label: s.label, points: s.points.map(p => [timed && p[2] !== undefined ? (p[2] - start) / 1000 : p[0], p[1]])};
    });
  }

  /* What a chart shows, as text: each series' last value, minimum and maximum (the summary,
     also the plot's accessible name), and every point in a table (the "Table view"). */
  function describe(box, shown, data, x) {
    const plot = box.querySelector(".plot");
    const title = (box.querySelector("h3") || {}).textContent || "Metric";
    const where = value => (x === "time" ? `at ${clock(value)}` : `at step ${value}`);
    const unit = x === "time" ? "value" : "step";
    const summary = shown.map(s => {
      const values = s.points.map(p => p[1]);
      const last = s.points[s.points.length - 1];
      return `${s.label}: last ${short(last[1])} ${where(last[0])}, min ${short(Math.min(...values))}, ` +
        `max ${short(Math.max(...values))} (${s.points.length} ${unit}${s.points.length === 1 ? "" : "s"})`;
    }).join("; ");
    if (plot && plot.hasAttribute("role")) plot.setAttribute("aria-label", shown.length ? `${title} chart: ${summary}` : "No values yet");
    const line = box.querySelector("[data-chart-summary]");
    if (line) line.textContent = summary;
    const holder = box.querySelector("[data-chart-table]");
    if (!holder) return;
    const table = document.createElement("table");
    const head = table.createTHead().insertRow();
    [x === "time" ? "time since start" : (box.dataset.xlabel || "step"), ...shown.map(s => s.label)].forEach(text => {
      const th = document.createElement("th"); th.textContent = text; th.scope = "col"; head.appendChild(th);
    });
    const body = table.createTBody();
    (data[0] || []).forEach((step, i) => {
      const row = body.insertRow();
      [step, ...data.slice(1).map(column => column[i])].forEach((value, j) => {
        const cell = row.insertCell(); cell.className = "num";
        cell.textContent = j ? short(value) : (x === "time" ? clock(value) : String(value));
      });
    });
    holder.replaceChildren(table);
  }

  /* The lines to draw: on a log scale values ≤ 0 are left out (said under the chart); with
     smoothing each series is drawn faint as logged and solid smoothed. */
  function lines(series, v) {
    const kept = v.log ? series.map(s => ({...s, points: s.points.filter(p => p[1] > 0)})) : series;
    if (!(v.smoothing > 0)) return kept.map(s => ({...s, raw: false}));
    return kept.flatMap(s => {
      const smoothed = smooth(s.points.map(p => p[1]), v.smoothing);
      return [{...s, label: `${s.label} (as logged)`, raw: true},
              {label: s.label, raw: false, points: s.points.map((p, i) => [p[0], smoothed[i]])}];
    });
  }

  function faint(colour) { return `${colour}55`; }

  /* Draw (or redraw) one chart in `box` (.chart element) from `series` ([{label, points:
     [[step, value, time], ...]}]) as the page's chart view says; `t0` (ms) is where a
     wall-clock axis starts. Keeps the series for a redraw when the view changes; sets
     box.dataset.points. */
  function draw(box, series, t0) {
    box._series = series; box._t0 = t0;
    const plot = box.querySelector(".plot");
    const v = viewOf(box);
    const shown = onAxis(series.filter(s => s.points.length), v.x, t0);
    box.dataset.points = String(shown.reduce((n, s) => n + s.points.length, 0));
    describe(box, shown, shown.length ? align(shown) : [], v.x);
    const note = box.querySelector("[data-chart-note]");
    const hidden = v.log ? shown.reduce((n, s) => n + s.points.filter(p => !(p[1] > 0)).length, 0) : 0;
    if (note) note.textContent = hidden ? `${hidden} value${hidden === 1 ? "" : "s"} ≤ 0 not drawn on the log scale.` : "";
    const drawn = lines(shown, v);
    if (!drawn.some(s => s.points.length) || typeof uPlot === "undefined") {
      plot.innerHTML = '<div class="none">No values yet</div>';
      if (box._uplot) box._uplot.destroy();
      box._uplot = null;
      return;
    }
    const data = align(drawn);
    const signature = JSON.stringify([drawn.map(s => s.label), v]);
    const latest = u => u.setLegend({idx: u.data[0].length - 1});  // the legend's values when not hovered
    if (box._uplot && box._signature === signature) { box._uplot.setData(data); latest(box._uplot); return; }
    if (box._uplot) box._uplot.destroy();
    plot.innerHTML = "";
    box._signature = signature;
    const time = v.x === "time";
    const xLabel = time ? "time since start" : (box.dataset.xlabel || "step");
    let colour = -1;
    box._uplot = new uPlot({
      width: Math.max(Math.min(plot.clientWidth || box.clientWidth - 16, window.innerWidth - 48), 240), height: 200,
      scales: {x: {time: false}, y: v.log ? {distr: 3, log: 10, range: logRange} : {range: yRange}},
      // steps are whole numbers: no ticks between them; times read m:ss
      axes: [{label: xLabel, incrs: time ? TIME_INCREMENTS : STEP_INCREMENTS, values: time ? (u, splits) => splits.map(clock) : undefined},
             {size: 64, values: ticks}],
      cursor: {drag: {x: true, y: false}},
      hooks: {setCursor: [u => { if (u.cursor.idx === null || u.cursor.idx === undefined) latest(u); }]},
      series: [{label: xLabel, value: time ? (u, value) => (value === null ? "—" : clock(value)) : undefined},
        ...drawn.map(s => {
          if (!s.raw) colour += 1;
          const stroke = PALETTE[(s.raw ? colour + 1 : colour) % PALETTE.length];
          return {label: s.label, stroke: s.raw ? faint(stroke) : stroke, width: s.raw ? 1 : 1.6, spanGaps: true,
                  class: s.raw ? "raw" : undefined, points: {show: !s.raw && s.points.length < 40}};
        })],
    }, data, plot);
    latest(box._uplot);
  }

  /* The chart controls of a page: every chart inside the same [data-chart-view] is redrawn
     when one changes. */
  function chartControls(root) {
    root.querySelectorAll("[data-chart-controls]").forEach(controls => {
      const smoothing = controls.querySelector("[data-smoothing]");
      const shown = controls.querySelector("[data-smoothing-value]");
      const log = controls.querySelector("[data-log-scale]");
      const x = controls.querySelector("[data-x-axis]");
      smoothing.value = String(view.smoothing); log.checked = view.log; x.value = view.x;
      if (shown) shown.textContent = Number(view.smoothing).toFixed(2);
      const apply = () => {
        view.smoothing = Math.min(0.99, Math.max(0, Number(smoothing.value) || 0));
        view.log = log.checked; view.x = x.value === "time" ? "time" : "step";
        if (shown) shown.textContent = view.smoothing.toFixed(2);
        try { localStorage.setItem(VIEW_KEY, JSON.stringify(view)); } catch (error) { /* storage off: this page only */ }
        document.querySelectorAll("[data-chart-view] .chart").forEach(box => { if (box._series) draw(box, box._series, box._t0); });
      };
      smoothing.addEventListener("input", apply);  // as the slider moves
      [log, x].forEach(input => input.addEventListener("change", apply));
    });
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

  /* A chart's metric keys among those logged: each of its patterns is a key, where `*` stands
     for any run of characters (`timing/*`, `system/gpu_*_utilization_percentage`). */
  function matching(patterns, keys) {
    return [...new Set(patterns.flatMap(pattern => {
      if (!pattern.includes("*")) return keys.includes(pattern) ? [pattern] : [];
      const re = new RegExp(`^${pattern.split("*").map(part => part.replace(/[.+?^${}()|[\]\\]/g, "\\$&")).join(".*")}$`);
      return keys.filter(key => re.test(key));
    }))];
  }

  /* --- a run's page: charts of its metrics and of the node's resources, refreshed while the
     run is active -------------------------------------------------------------------------- */
  function runCharts(root) {
    const note = document.getElementById("metrics-note");
    const resources = document.getElementById("resource-charts");
    const metricBoxes = [...root.querySelectorAll(".chart")];
    const resourceBoxes = resources ? [...resources.querySelectorAll(".chart")] : [];
    const boxes = [...metricBoxes, ...resourceBoxes];
    const url = root.dataset.metricsUrl;
    const state = () => (document.getElementById("run-status") || {dataset: {}}).dataset.state;
    let last = false;

    async function refresh() {
      try {
        const index = await getJSON(url);
        const keysOf = box => matching(box.dataset.keys.split(","), index.keys);
        const wanted = [...new Set(boxes.flatMap(keysOf))];
        const history = wanted.length
          ? (await getJSON(`${url}?keys=${encodeURIComponent(wanted.join(","))}&max_points=500`)).history : {};
        // a wall-clock axis starts at the run's first logged value, for every chart alike
        const times = Object.values(history).flatMap(points => points.slice(0, 1).map(p => p[2]));
        const t0 = times.length ? Math.min(...times) : undefined;
        const ended = TERMINAL.includes(state());
        boxes.forEach(box => {
          const keys = keysOf(box);
          // nothing of it was logged, and nothing will be (a node without a GPU: no device charts)
          box.hidden = (ended || resourceBoxes.includes(box)) && !keys.length;
          draw(box, keys.map(k => ({label: k, points: history[k] || []})), t0);
        });
        root.dataset.loaded = "true";
        const empty = document.querySelector("[data-no-metrics]");
        if (empty) empty.hidden = !(ended && metricBoxes.every(box => box.hidden));
        const noResources = document.querySelector("[data-no-resources]");
        if (noResources) noResources.hidden = !resourceBoxes.every(box => box.hidden);
        if (resources) resources.dataset.loaded = "true";
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
    chartControls(document);
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
