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

  /* Draw (or redraw) one chart in `box` (.chart element); sets box.dataset.points. */
  function draw(box, series) {
    const plot = box.querySelector(".plot");
    const shown = series.filter(s => s.points.length);
    box.dataset.points = String(shown.reduce((n, s) => n + s.points.length, 0));
    if (!shown.length || typeof uPlot === "undefined") {
      plot.innerHTML = '<div class="none">No values yet</div>';
      box._uplot = null;
      return;
    }
    const data = align(shown);
    const labels = shown.map(s => s.label).join("|");
    if (box._uplot && box._labels === labels) { box._uplot.setData(data); return; }
    if (box._uplot) box._uplot.destroy();
    plot.innerHTML = "";
    box._labels = labels;
    box._uplot = new uPlot({
      width: Math.max(plot.clientWidth || box.clientWidth - 16, 280), height: 200,
      scales: {x: {time: false}},
      axes: [{label: box.dataset.xlabel || "step"}, {size: 64, values: ticks}],
      cursor: {drag: {x: true, y: false}},
      series: [{label: box.dataset.xlabel || "step"}, ...shown.map((s, i) => ({
        label: s.label, stroke: PALETTE[i % PALETTE.length], width: 1.6, spanGaps: true,
        points: {show: s.points.length < 40},
      }))],
    }, data, plot);
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

    function append(text) {
      text = text.replace(ANSI, "");
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
      let content = pre.textContent + text;
      if (content.length > MAX) content = "…" + content.slice(-MAX);
      pre.textContent = content;
      if (atBottom) pre.scrollTop = pre.scrollHeight;
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

  function copyButtons() {
    document.querySelectorAll("[data-copy]").forEach(button => button.addEventListener("click", () => {
      const text = document.querySelector(button.dataset.copy).textContent;
      const done = () => { button.textContent = "Copied"; setTimeout(() => { button.textContent = "Copy YAML"; }, 1500); };
      if (navigator.clipboard) navigator.clipboard.writeText(text).then(done, () => {});
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
    barWidths(document);
    const submitForm = document.getElementById("submit-form");
    if (submitForm) keepFormKey(submitForm);
  });
})();
