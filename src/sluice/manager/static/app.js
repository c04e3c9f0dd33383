// Sluice manager console: one page, hash routes, the API polled every 2 s.
//
// Every string that comes from the server (topic names, task definitions, error messages) is
// put into the page as a text node or an attribute value, never parsed as HTML: the helper h()
// below is the only way this file builds elements.
"use strict";

(() => {
  const API = "/api/v1";
  const params = new URLSearchParams(location.search);
  // ?poll_ms=300 lets the browser tests see changes sooner; people get the 2 s of the issue.
  const POLL_MS = clamp(parseInt(params.get("poll_ms") || "2000", 10) || 2000, 100, 60000);
  const ROLE_RANK = { viewer: 0, operator: 1, admin: 2 };
  const SPARK_SAMPLES_MAX = 150; // per task / group, kept in the page between polls
  const STORE = sessionStorage;

  const state = {
    token: STORE.getItem("sluice.token"),
    user: STORE.getItem("sluice.user") || "",
    role: STORE.getItem("sluice.role") || "viewer",
    view: null, // the mounted view: {refresh(): Promise}
    generation: 0, // bumped on every route change: answers for an older view are dropped
    timer: null,
    polling: false,
    pollAgain: false,
    lastOk: null, // Date of the last successful poll
    sparks: new Map(), // "task:ID" / "group:NAME" -> [{t, v}] seen by this page
  };

  // ---------------------------------------------------------------- small helpers

  function clamp(v, lo, hi) { return Math.min(hi, Math.max(lo, v)); }
  const $ = (id) => document.getElementById(id);

  /** An element with attributes and children; strings become text nodes (never HTML). */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    setAttrs(el, attrs);
    appendAll(el, children);
    return el;
  }

  function setAttrs(el, attrs) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.setAttribute("class", v);
      else if (k === "testid") el.dataset.testid = v;
      else if (k === "data") for (const [dk, dv] of Object.entries(v)) el.dataset[dk] = String(dv);
      else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
  }

  function appendAll(el, children) {
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : String(c));
    }
  }

  /** Replace an element's children. */
  function fill(el, ...children) {
    el.replaceChildren();
    appendAll(el, children);
    return el;
  }

  const SVG_NS = "http://www.w3.org/2000/svg";
  function s(tag, attrs, ...children) {
    const el = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) el.setAttribute(k, String(v));
    appendAll(el, children);
    return el;
  }

  const pad2 = (n) => String(n).padStart(2, "0");
  function hms(date) { return `${pad2(date.getHours())}:${pad2(date.getMinutes())}:${pad2(date.getSeconds())}`; }
  function toDate(t) {
    if (t === null || t === undefined || t === "") return null;
    if (typeof t === "number") return new Date(t * 1000);
    const d = new Date(t);
    return isNaN(d.getTime()) ? null : d;
  }
  function when(t) {
    const d = toDate(t);
    if (!d) return "—";
    const today = new Date();
    const sameDay = d.toDateString() === today.toDateString();
    const date = `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())}`;
    return sameDay ? hms(d) : `${date} ${hms(d)}`;
  }
  function ago(t) {
    const d = toDate(t);
    if (!d) return "";
    const s = Math.max(0, Math.round((Date.now() - d.getTime()) / 1000));
    if (s < 60) return `${s} s ago`;
    if (s < 3600) return `${Math.round(s / 60)} min ago`;
    if (s < 86400) return `${Math.round(s / 3600)} h ago`;
    return `${Math.round(s / 86400)} d ago`;
  }
  /** A time cell: the clock time, with "N s ago" as a tooltip. */
  function timeCell(t) { return h("span", { title: ago(t) }, when(t)); }
  function num(n) {
    if (n === null || n === undefined || n === "") return "—";
    if (typeof n !== "number") return String(n);
    return n.toLocaleString("en-US", { maximumFractionDigits: 1 });
  }
  function seconds(n) {
    if (n === null || n === undefined) return "—";
    if (n < 120) return `${num(n)} s`;
    if (n < 7200) return `${num(n / 60)} min`;
    return `${num(n / 3600)} h`;
  }
  function text(v) {
    if (v === null || v === undefined) return "—";
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  }
  function list(v) { return Array.isArray(v) ? v.join(", ") : text(v); }
  function canOperate() { return (ROLE_RANK[state.role] ?? 0) >= ROLE_RANK.operator; }

  function badge(label, level) { return h("span", { class: `badge ${level || ""}` }, label); }
  const STATE_LEVEL = {
    running: "ok", ok: "ok", stable: "ok", resolved: "ok", alive: "ok",
    paused: "", waiting: "warning", acknowledged: "warning", "under-replicated": "warning", warning: "warning",
    failing: "critical", failed: "critical", offline: "critical", open: "critical", critical: "critical", dead: "critical",
  };
  function stateBadge(v, testid) {
    const label = v === null || v === undefined ? "—" : String(v);
    const el = badge(label, STATE_LEVEL[label.toLowerCase()] || "");
    if (testid) el.dataset.testid = testid;
    return el;
  }

  function table(headers, rows, emptyText) {
    if (!rows.length) return h("p", { class: "empty" }, emptyText || "Nothing here.");
    return h(
      "table", {},
      h("thead", {}, h("tr", {}, headers.map((x) => (typeof x === "string" ? h("th", {}, x) : x)))),
      h("tbody", {}, rows),
    );
  }
  const th = (label, cls) => h("th", { class: cls }, label);
  const td = (content, attrs) => h("td", attrs || {}, content);
  const tdNum = (content) => h("td", { class: "num" }, content);

  // ---------------------------------------------------------------- API

  class ApiError extends Error {
    constructor(status, detail, field) {
      super(detail);
      this.status = status;
      this.field = field || null;
    }
  }
  class Unreachable extends Error {}

  function detailText(data, resp) {
    if (data && typeof data.detail === "string") return data.detail;
    if (data && Array.isArray(data.detail)) {
      // FastAPI's own request validation: [{loc, msg}, ...]
      return data.detail.map((d) => `${(d.loc || []).join(".")}: ${d.msg}`).join("; ");
    }
    return `${resp.status} ${resp.statusText || "error"}`;
  }

  async function api(method, path, body, contentType) {
    const headers = {};
    if (state.token) headers.Authorization = `Bearer ${state.token}`;
    let payload;
    if (body !== undefined) {
      headers["Content-Type"] = contentType || "application/json";
      payload = contentType && contentType !== "application/json" ? body : JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(API + path, { method, headers, body: payload, cache: "no-store" });
    } catch (e) {
      throw new Unreachable(`the manager did not answer (${e.message})`);
    }
    const raw = await resp.text().catch(() => "");
    let data = null;
    if (raw) {
      try { data = JSON.parse(raw); } catch { data = null; }
    }
    if (resp.status === 401 && path !== "/login") {
      showLogin("Your session has ended: log in again.");
      throw new ApiError(401, detailText(data, resp));
    }
    if (resp.status >= 502 && resp.status <= 504) throw new Unreachable(detailText(data, resp));
    if (!resp.ok) throw new ApiError(resp.status, detailText(data, resp), data && data.field);
    return data;
  }
  const get = (path) => api("GET", path);

  // ---------------------------------------------------------------- status line, banner, flash

  function markOk() {
    state.lastOk = new Date();
    const el = $("last-updated");
    el.textContent = `last updated ${hms(state.lastOk)}`;
    el.classList.remove("stale");
    $("error-banner").hidden = true;
  }

  function pollFailed(err) {
    if (err instanceof ApiError && err.status === 401) return; // showLogin took over
    const banner = $("error-banner");
    const since = state.lastOk ? ` Showing what it said at ${hms(state.lastOk)}.` : "";
    if (err instanceof Unreachable) {
      banner.textContent = `The manager is unreachable: ${err.message}. Retrying every ${POLL_MS / 1000} s.${since}`;
    } else if (err instanceof ApiError && err.status >= 500) {
      banner.textContent = `The manager could not answer: ${err.message}. Retrying every ${POLL_MS / 1000} s.${since}`;
    } else {
      banner.textContent = `Could not load this page: ${err.message}.${since}`;
    }
    banner.hidden = false;
    $("last-updated").classList.add("stale");
  }

  let flashTimer = null;
  function flash(message, ok) {
    const el = $("flash");
    clearTimeout(flashTimer);
    fill(el, h("span", { testid: "flash-text" }, message),
      h("button", { class: "close", type: "button", title: "Dismiss", onclick: () => { el.hidden = true; } }, "×"));
    el.className = `flash ${ok ? "ok" : "error"}`;
    el.dataset.kind = ok ? "ok" : "error";
    el.hidden = false;
    if (ok) flashTimer = setTimeout(() => { el.hidden = true; }, 8000);
  }

  /** Run an action (a POST/DELETE), tell the user how it went, refresh the page's data. */
  async function act(label, fn) {
    try {
      const result = await fn();
      flash(`${label}: done.`, true);
      refreshNow();
      return result;
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) return undefined;
      flash(`${label} failed: ${e.message}`, false);
      return undefined;
    }
  }

  /** An action button: disabled, with the reason as tooltip, for a role that cannot use it. */
  function actionButton(label, testid, onclick, opts) {
    const o = opts || {};
    const allowed = canOperate();
    return h("button", {
      type: "button", testid, class: o.danger ? "danger" : o.primary ? "primary" : "",
      disabled: !allowed || o.disabled,
      title: allowed ? o.title : `Your role (${state.role}) can only look; an operator can ${label.toLowerCase()}.`,
      onclick,
    }, label);
  }

  function roleNote() {
    if (canOperate()) return null;
    return h("span", { class: "role-note", testid: "role-note" },
      `You are signed in as a ${state.role}: actions are disabled.`);
  }

  // ---------------------------------------------------------------- dialog

  /** A modal confirmation; resolves with the fields' values, or null if cancelled. `run` (optional)
   *  is awaited before the dialog closes, so a refused request keeps it open with the error. */
  function confirmDialog({ title, body, okLabel, danger, fields, run }) {
    return new Promise((resolve) => {
      const backdrop = $("dialog-backdrop");
      const form = $("dialog");
      const ok = $("dialog-ok");
      const err = $("dialog-error");
      $("dialog-title").textContent = title;
      $("dialog-text").textContent = body || "";
      err.hidden = true;
      const inputs = {};
      fill($("dialog-fields"), (fields || []).map((f) => {
        const input = h("input", { id: `dialog-field-${f.name}`, testid: `confirm-field-${f.name}`,
          placeholder: f.placeholder || "", value: f.value || "", required: f.required });
        inputs[f.name] = input;
        return [h("label", { for: input.id }, f.label), input];
      }));
      ok.textContent = okLabel || "OK";
      ok.className = danger ? "danger" : "primary";
      backdrop.hidden = false;
      (Object.values(inputs)[0] || ok).focus();

      const close = (value) => {
        backdrop.hidden = true;
        form.onsubmit = null;
        $("dialog-cancel").onclick = null;
        document.removeEventListener("keydown", onKey);
        resolve(value);
      };
      const onKey = (e) => { if (e.key === "Escape") close(null); };
      document.addEventListener("keydown", onKey);
      $("dialog-cancel").onclick = () => close(null);
      form.onsubmit = async (e) => {
        e.preventDefault();
        const values = Object.fromEntries(Object.entries(inputs).map(([k, i]) => [k, i.value.trim()]));
        if (!run) return close(values);
        ok.disabled = true;
        try {
          await run(values);
          close(values);
        } catch (ex) {
          err.textContent = ex.message;
          err.hidden = false;
        } finally {
          ok.disabled = false;
        }
      };
    });
  }

  // ---------------------------------------------------------------- charts (inline SVG)

  function niceStep(range, ticks) {
    const raw = range / ticks;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const norm = raw / mag;
    return (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
  }

  function shortNum(v) {
    if (v >= 1e6) return `${+(v / 1e6).toFixed(1)}M`;
    if (v >= 1e4) return `${+(v / 1e3).toFixed(1)}k`;
    return `${+v.toFixed(2)}`;
  }

  /** A line chart of points [{t: epoch s, v: number}] as an <svg>. */
  function lineChartSvg(points, opts) {
    const W = 640, H = 210, L = 52, R = 14, T = 12, B = 26;
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": opts.label });
    if (!points.length) {
      svg.append(s("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty-label" }, "No samples yet"));
      return svg;
    }
    let t0 = points[0].t, t1 = points[points.length - 1].t;
    if (t1 <= t0) { t0 -= 30; t1 += 1; }
    // A threshold far above the data would flatten it: drawn only when near (the caption says it).
    const dataMax = Math.max(...points.map((p) => p.v));
    const threshold = opts.threshold && opts.threshold <= 2 * Math.max(dataMax, 1) ? opts.threshold : null;
    const vmax = Math.max(dataMax, threshold || 0);
    const step = vmax > 0 ? niceStep(vmax, 4) : 1;
    const ymax = Math.max(step, Math.ceil(vmax / step) * step);
    const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
    const y = (v) => T + (1 - v / ymax) * (H - T - B);
    for (let v = 0; v <= ymax + step / 2; v += step) {
      svg.append(s("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }));
      svg.append(s("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end", class: "axis-label" }, shortNum(v)));
    }
    for (const [t, anchor] of [[t0, "start"], [(t0 + t1) / 2, "middle"], [t1, "end"]]) {
      svg.append(s("text", { x: x(t), y: H - 6, "text-anchor": anchor, class: "axis-label" }, hms(new Date(t * 1000))));
    }
    if (threshold) {
      svg.append(s("line", { x1: L, x2: W - R, y1: y(threshold), y2: y(threshold), class: "threshold" }));
    }
    const line = points.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(" ");
    const base = y(0).toFixed(1);
    svg.append(s("polygon", { points: `${x(points[0].t).toFixed(1)},${base} ${line} ${x(points[points.length - 1].t).toFixed(1)},${base}`, class: "area" }));
    svg.append(s("polyline", { points: line, class: "series" }));
    const last = points[points.length - 1];
    svg.append(s("circle", { cx: x(last.t), cy: y(last.v), r: 3.5, class: "dot" }));
    return svg;
  }

  /** A chart panel that keeps its element between polls (tests and eyes stay on it). Its data-*
   *  attributes carry the numbers drawn: points, last, max. */
  function chartPanel(testid, label, format) {
    const now = h("span", { class: "now" });
    const body = h("div");
    const el = h("figure", { class: "chart", testid, data: { points: 0 } }, h("figcaption", {}, label, now), body);
    return {
      el,
      update(points, opts) {
        fill(body, lineChartSvg(points, { label, ...(opts || {}) }));
        const last = points.length ? points[points.length - 1].v : null;
        el.dataset.points = String(points.length);
        el.dataset.last = last === null ? "" : String(last);
        el.dataset.max = points.length ? String(Math.max(...points.map((p) => p.v))) : "";
        const f = format || num;
        const parts = [];
        if (opts && opts.threshold) parts.push(`alarm at ${f(opts.threshold)}`);
        if (last !== null) parts.push(`now ${f(last)}`);
        now.textContent = parts.join(" · ");
      },
    };
  }

  /** A small line of the values this page has seen for `key`. */
  function sparkline(key, value) {
    let samples = state.sparks.get(key);
    if (!samples) state.sparks.set(key, (samples = []));
    if (value !== null && value !== undefined) {
      samples.push(value);
      if (samples.length > SPARK_SAMPLES_MAX) samples.shift();
    }
    const W = 120, H = 26;
    const svg = s("svg", { class: "spark", viewBox: `0 0 ${W} ${H}`, "aria-hidden": "true" });
    if (samples.length < 2) return svg;
    const max = Math.max(1, ...samples);
    const pts = samples.map((v, i) => `${((i / (samples.length - 1)) * (W - 2) + 1).toFixed(1)},${(H - 2 - (v / max) * (H - 4)).toFixed(1)}`);
    svg.append(s("polyline", { points: pts.join(" ") }));
    return svg;
  }

  // ---------------------------------------------------------------- views

  /** Each view builds its frame once (forms, buttons and charts keep their state and focus) and
   *  fills its data sections on every poll. */
  const views = {};

  views.overview = () => {
    const headline = h("div", { class: "headline ok", testid: "overall-status" });
    const attention = h("ul", { class: "attention", testid: "attention" });
    const cards = h("div", { class: "cards" });
    const problems = h("div");
    const brokers = h("div");
    const tasks = h("div");
    const alarms = h("div");
    const root = h("div", {},
      h("div", { class: "page-head" }, h("h1", {}, "Overview"), h("span", { class: "crumb", id: "cluster-id", testid: "cluster-id" })),
      headline, attention, cards,
      h("h2", {}, "Partitions that need attention"), problems,
      h("div", { class: "grid2" },
        h("section", {}, h("h2", {}, "Brokers"), brokers),
        h("section", {}, h("h2", {}, "Open alarms"), alarms)),
      h("h2", {}, "Tasks"), tasks);

    async function refresh() {
      const o = await get("/overview");
      const c = o.cluster;
      const alarmsList = o.alarms || [];
      // The partition lines of `attention` come from c.problems, which the page groups (one
      // broker down can leave fifty partitions under-replicated for one reason): the other lines
      // are shown as the server wrote them.
      const groups = problemGroups(c.problems);
      const others = (o.attention || []).filter((line) => !line.startsWith("partition "));
      const items = [
        ...others.filter((line) => !line.startsWith("alarm: ")),
        ...groups.map((g) => `${g.label} ${g.partitions.length === 1 ? "is" : "are"} ${g.status}: ${g.reason}`),
        ...others.filter((line) => line.startsWith("alarm: ")),
      ];
      const anyCritical = c.partitions.offline > 0 || c.controller.id < 0
        || c.brokers.some((b) => !b.alive) || alarmsList.some((a) => a.severity === "critical" && a.state === "open")
        || (o.tasks || []).some((t) => t.state === "failing");
      const level = !items.length ? "ok" : anyCritical ? "critical" : "warning";
      headline.className = `headline ${level}`;
      headline.dataset.level = level;
      headline.textContent = items.length
        ? `${items.length} ${items.length === 1 ? "thing needs" : "things need"} attention`
        : "All clear: every partition online and in sync, every task running";
      const ATTENTION_SHOWN = 8;
      fill(attention, items.slice(0, ATTENTION_SHOWN).map((line) => h("li", { testid: "attention-item" }, line)),
        items.length > ATTENTION_SHOWN
          ? h("li", { class: "muted" }, `and ${items.length - ATTENTION_SHOWN} more below`) : null);
      $("cluster-id").textContent = c.cluster_id ? `cluster ${c.cluster_id}` : "";

      const alive = c.brokers.filter((b) => b.alive).length;
      const ts = o.tasks || [];
      const failing = ts.filter((t) => t.state === "failing").length;
      const behind = ts.filter((t) => t.open_alarms > 0 && t.state !== "failing").length;
      const openAlarms = alarmsList.filter((a) => a.state === "open");
      fill(cards,
        card("Controller", c.controller.id >= 0 ? `broker ${c.controller.id}` : "none",
          `epoch ${c.controller.epoch}`, c.controller.id >= 0 ? "ok" : "critical", "card-controller"),
        card("Brokers", `${alive} / ${c.brokers.length}`, alive === c.brokers.length ? "all alive" : `${c.brokers.length - alive} down`,
          alive === c.brokers.length ? "ok" : "critical", "card-brokers"),
        card("Partitions", num(c.partitions.total),
          `${c.partitions.offline} offline · ${c.partitions.under_replicated} under-replicated`,
          c.partitions.offline ? "critical" : c.partitions.under_replicated ? "warning" : "ok", "card-partitions"),
        card("Tasks", num(ts.length), `${failing} failing · ${behind} with alarms`,
          failing ? "critical" : behind ? "warning" : "ok", "card-tasks"),
        card("Open alarms", num(openAlarms.length), `${alarmsList.length - openAlarms.length} acknowledged`,
          openAlarms.some((a) => a.severity === "critical") ? "critical" : openAlarms.length ? "warning" : "ok", "card-alarms"));

      fill(problems, table(
        ["Topic", "Partitions", "Status", "Leader", "Replicas", "In sync", "Reason"],
        groups.map((g) => {
          const p = g.first;
          const same = (k) => g.members.every((m) => String(m[k]) === String(p[k]));
          return h("tr", {
            testid: "partition-problem", class: g.status === "offline" ? "row-critical" : "row-warning",
            data: { topic: g.topic, partitions: g.partitions.join(","), status: g.status,
              partition: g.partitions.length === 1 ? g.partitions[0] : "" },
          },
          td(h("a", { href: `#/topics/${encodeURIComponent(g.topic)}` }, g.topic)), td(ranges(g.partitions)),
          td(stateBadge(g.status)), td(same("leader") ? (p.leader >= 0 ? String(p.leader) : "none") : "various"),
          td(same("replicas") ? list(p.replicas) : "various"), td(same("isr") ? list(p.isr) : "various"),
          td(g.reason, { class: "reason" }));
        }),
        "Every partition is online with all its replicas in sync."));

      fill(brokers, table(
        ["Broker", "Address", "Status", ""],
        c.brokers.map((b) => h("tr", { testid: "broker-row", class: b.alive ? "" : "row-critical", data: { broker: b.id, alive: b.alive } },
          tdNum(b.id), td(b.host ? h("span", { class: "mono" }, `${b.host}:${b.port}`) : h("span", { class: "muted" }, "not registered")),
          td(stateBadge(b.alive ? "alive" : "dead")),
          td(b.id === c.controller.id ? badge(`controller · epoch ${c.controller.epoch}`, "") : ""))),
        "No brokers registered."));

      fill(alarms, alarmsList.length
        ? h("ul", { class: "attention" }, alarmsList.map((a) => h("li", { testid: "overview-alarm", data: { id: a.id, state: a.state } },
          stateBadge(a.severity), " ", a.summary, " ", h("span", { class: "muted" }, `(${a.state}, ${ago(a.raised_at)})`))))
        : h("p", { class: "empty" }, "No open alarms."));

      fill(tasks, tasksTable(ts));
    }
    return { root, refresh };
  };

  /** Problems grouped by topic, status and reason, offline first. */
  function problemGroups(problems) {
    const byKey = new Map();
    for (const p of problems || []) {
      const key = JSON.stringify([p.topic, p.status, p.reason]);
      if (!byKey.has(key)) byKey.set(key, { topic: p.topic, status: p.status, reason: p.reason, first: p, members: [], partitions: [] });
      const g = byKey.get(key);
      g.members.push(p);
      g.partitions.push(p.partition);
    }
    const groups = [...byKey.values()];
    for (const g of groups) {
      g.partitions.sort((a, b) => a - b);
      g.label = g.partitions.length === 1 ? `partition ${g.topic}-${g.partitions[0]}`
        : `${g.partitions.length} partitions of ${g.topic} (${ranges(g.partitions)})`;
    }
    const rank = (g) => (g.status === "offline" ? 0 : 1);
    return groups.sort((a, b) => rank(a) - rank(b) || a.topic.localeCompare(b.topic));
  }

  /** [0,1,2,3,7,9,10] -> "0–3, 7, 9–10" */
  function ranges(numbers) {
    const out = [];
    for (let i = 0; i < numbers.length; i++) {
      let j = i;
      while (j + 1 < numbers.length && numbers[j + 1] === numbers[j] + 1) j++;
      out.push(j > i ? `${numbers[i]}–${numbers[j]}` : String(numbers[i]));
      i = j;
    }
    return out.join(", ");
  }

  function card(label, value, sub, level, testid) {
    return h("div", { class: `card ${level}`, testid, data: { level } },
      h("div", { class: "label" }, label), h("div", { class: "value" }, value), h("div", { class: "sub" }, sub));
  }

  function tasksTable(ts) {
    return table(
      ["Task", "State", "Worker", th("Epoch", "num"), th("Lag (records)", "num"), th("Lag", "num"), "Lag trend", "Error"],
      ts.map((t) => h("tr", {
        testid: "task-row", class: t.state === "failing" ? "row-critical" : t.open_alarms ? "row-warning" : "",
        data: { task: t.id, state: t.state },
      },
      td(h("a", { href: `#/tasks/${encodeURIComponent(t.id)}` }, t.id)),
      td([stateBadge(t.state), t.open_alarms ? [" ", badge(`${t.open_alarms} alarm${t.open_alarms > 1 ? "s" : ""}`, "critical")] : null]),
      td(t.worker || "—"), tdNum(num(t.epoch)), tdNum(num(t.lag_records)), tdNum(seconds(t.lag_seconds)),
      td(sparkline(`task:${t.id}`, t.lag_records)),
      td(t.error ? h("span", { class: "error-text" }, t.error) : ""))),
      "No tasks yet.");
  }

  // ---- topics

  views.topics = () => {
    const body = h("div");
    const formError = h("p", { class: "form-error", testid: "topic-create-error", hidden: true });
    const name = h("input", { name: "name", placeholder: "orders.changes", required: true, testid: "topic-name" });
    const partitions = h("input", { name: "partitions", type: "number", min: 1, value: 3, style: "width:90px", testid: "topic-partitions" });
    const rf = h("input", { name: "replication_factor", type: "number", min: 1, placeholder: "default", style: "width:110px", testid: "topic-rf" });
    const single = h("input", { type: "checkbox", testid: "topic-single-replica" });
    const form = h("form", { class: "inline", testid: "topic-create" },
      h("label", {}, "Name", name), h("label", {}, "Partitions", partitions), h("label", {}, "Replication factor", rf),
      h("label", { class: "check", title: "A partition with one replica goes offline when its broker does" },
        single, "allow a single replica"),
      h("button", { type: "submit", class: "primary", disabled: !canOperate(), testid: "topic-create-submit" }, "Create topic"),
      roleNote());
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      formError.hidden = true;
      const created = await act(`Create topic ${name.value}`, async () => {
        try {
          return await api("POST", "/topics", {
            name: name.value.trim(), partitions: parseInt(partitions.value, 10),
            replication_factor: rf.value.trim() ? parseInt(rf.value, 10) : -1, // -1: the cluster's default
            allow_single_replica: single.checked,
          });
        } catch (ex) {
          if (ex instanceof ApiError) { formError.textContent = ex.message; formError.hidden = false; }
          throw ex;
        }
      });
      if (created) name.value = "";
    });
    const root = h("div", {}, h("div", { class: "page-head" }, h("h1", {}, "Topics")), body,
      h("h2", {}, "New topic"), h("div", { class: "panel" }, form, formError));

    async function refresh() {
      const topics = await get("/topics");
      fill(body, table(
        ["Topic", th("Partitions", "num"), th("Replication", "num"), "Health", ""],
        topics.map((t) => h("tr", {
          testid: "topic-row", class: t.offline ? "row-critical" : t.under_replicated ? "row-warning" : "",
          data: { topic: t.name },
        },
        td(h("a", { href: `#/topics/${encodeURIComponent(t.name)}` }, t.name)), tdNum(t.partitions), tdNum(t.replication_factor),
        td(t.offline ? badge(`${t.offline} offline`, "critical")
          : t.under_replicated ? badge(`${t.under_replicated} under-replicated`, "warning") : badge("ok", "ok")),
        td(t.internal ? badge("internal") : ""))),
        "No topics yet."));
    }
    return { root, refresh };
  };

  views.topic = (topicName) => {
    const parts = h("div");
    const configs = h("div");
    const del = actionButton("Delete", "topic-delete", async () => {
      await confirmDialog({
        title: `Delete topic ${topicName}?`,
        body: "Its partitions and every record in them are removed on every broker. This cannot be undone.",
        okLabel: "Delete topic", danger: true,
        run: () => api("DELETE", `/topics/${encodeURIComponent(topicName)}`).then(() => {
          flash(`Deleted topic ${topicName}.`, true);
          location.hash = "#/topics";
        }),
      });
    }, { danger: true });
    const root = h("div", {},
      h("div", { class: "page-head" }, h("span", { class: "crumb" }, h("a", { href: "#/topics" }, "Topics"), " /"),
        h("h1", { testid: "topic-title" }, topicName)),
      h("div", { class: "actions" }, del, roleNote()),
      h("h2", {}, "Partitions"), parts, h("h2", {}, "Configuration"), configs);

    async function refresh() {
      const t = await get(`/topics/${encodeURIComponent(topicName)}`);
      fill(parts, table(
        [th("Partition", "num"), "Status", th("Leader", "num"), "Replicas", "In sync", th("Log start", "num"), th("Log end", "num"), "Reason"],
        t.partitions.map((p) => h("tr", {
          testid: "topic-partition", class: p.status === "offline" ? "row-critical" : p.status === "ok" ? "" : "row-warning",
          data: { partition: p.partition, status: p.status },
        },
        tdNum(p.partition), td(stateBadge(p.status)), tdNum(p.leader >= 0 ? p.leader : "none"), td(list(p.replicas)),
        td(list(p.isr)), tdNum(num(p.log_start)), tdNum(num(p.log_end)), td(p.reason || "", { class: "reason" }))),
        "No partitions."));
      const entries = Object.entries(t.configs || {});
      fill(configs, table(["Key", "Value"], entries.map(([k, v]) => h("tr", {}, td(h("span", { class: "mono" }, k)), td(text(v)))),
        "Defaults only."));
    }
    return { root, refresh };
  };

  // ---- groups

  views.groups = () => {
    const body = h("div");
    const root = h("div", {}, h("div", { class: "page-head" }, h("h1", {}, "Consumer groups")), body);
    async function refresh() {
      const groups = await get("/groups");
      fill(body, table(
        ["Group", "State", "Type", th("Coordinator", "num"), th("Members", "num"), th("Lag (records)", "num"), "Lag trend"],
        groups.map((g) => h("tr", { testid: "group-row", data: { group: g.group } },
          td(h("a", { href: `#/groups/${encodeURIComponent(g.group)}` }, g.group)), td(stateBadge(g.state)),
          td(g.protocol_type || "—"), tdNum(text(g.coordinator)), tdNum(g.members), tdNum(num(g.total_lag)),
          td(sparkline(`group:${g.group}`, g.total_lag)))),
        "No consumer groups."));
    }
    return { root, refresh };
  };

  views.group = (groupName) => {
    const facts = h("dl", { class: "facts" });
    const chart = chartPanel("group-lag-chart", "Lag (records), last hour");
    const members = h("div");
    const partitions = h("div");
    const topicSelect = h("select", { testid: "reset-topic" });
    const toSelect = h("select", { testid: "reset-to" },
      h("option", { value: "earliest" }, "earliest"), h("option", { value: "latest" }, "latest"),
      h("option", { value: "offset" }, "offset…"));
    const offset = h("input", { type: "number", min: 0, placeholder: "offset", style: "width:120px", testid: "reset-offset", hidden: true });
    toSelect.addEventListener("change", () => { offset.hidden = toSelect.value !== "offset"; });
    const resetForm = h("form", { class: "inline", testid: "reset-offsets" },
      h("label", {}, "Topic", topicSelect), h("label", {}, "Reset to", toSelect), offset,
      h("button", { type: "submit", class: "danger", disabled: !canOperate(), testid: "reset-submit" }, "Reset offsets"),
      roleNote());
    resetForm.addEventListener("submit", async (e) => {
      e.preventDefault();
      const to = toSelect.value === "offset" ? parseInt(offset.value, 10) : toSelect.value;
      if (toSelect.value === "offset" && !(to >= 0)) { flash("Reset offsets: give an offset (0 or more).", false); return; }
      await confirmDialog({
        title: `Reset ${groupName} on ${topicSelect.value}?`,
        body: `Every partition's committed offset becomes ${to}. The group must have no active members.`,
        okLabel: "Reset offsets", danger: true,
        run: async () => {
          const r = await api("POST", `/groups/${encodeURIComponent(groupName)}/reset-offsets`, { topic: topicSelect.value, to });
          flash(`Reset offsets of ${groupName}: ${Object.entries(r.offsets || {}).map(([p, o]) => `${p}→${o}`).join(", ")}`, true);
          refreshNow();
        },
      });
    });
    const root = h("div", {},
      h("div", { class: "page-head" }, h("span", { class: "crumb" }, h("a", { href: "#/groups" }, "Groups"), " /"),
        h("h1", { testid: "group-title" }, groupName)),
      h("div", { class: "grid2" }, h("div", { class: "panel" }, facts), chart.el),
      h("h2", {}, "Partitions"), partitions, h("h2", {}, "Members"), members,
      h("h2", {}, "Reset offsets"), h("div", { class: "panel" }, resetForm));

    async function refresh() {
      const [g, hist] = await Promise.all([
        get(`/groups/${encodeURIComponent(groupName)}`),
        get(`/groups/${encodeURIComponent(groupName)}/lag-history`),
      ]);
      fill(facts,
        h("dt", {}, "State"), h("dd", {}, stateBadge(g.state)),
        h("dt", {}, "Protocol"), h("dd", {}, `${g.protocol_type || "—"} / ${g.protocol || "—"}`),
        h("dt", {}, "Coordinator"), h("dd", {}, `broker ${text(g.coordinator)}`),
        h("dt", {}, "Total lag"), h("dd", { testid: "group-total-lag" }, num(g.total_lag)));
      chart.update((hist.samples || []).filter((x) => typeof x.lag === "number").map((x) => ({ t: x.t, v: x.lag })));
      fill(partitions, table(["Topic", th("Partition", "num"), th("Committed", "num"), th("End", "num"), th("Lag", "num"), "Member"],
        g.partitions.map((p) => h("tr", { testid: "group-partition" }, td(p.topic), tdNum(p.partition), tdNum(num(p.committed)),
          tdNum(num(p.end)), tdNum(num(p.lag)), td(p.member || "—"))),
        "No committed offsets."));
      fill(members, table(["Member", "Client", "Host", "Assignment"],
        g.members.map((m) => h("tr", { testid: "group-member" }, td(h("span", { class: "mono" }, m.member_id)), td(m.client_id), td(m.host),
          td((m.assignment || []).map(([t, p]) => `${t}[${p}]`).join(", ") || "—"))),
        "No active members."));
      const topics = [...new Set(g.partitions.map((p) => p.topic))];
      const current = topicSelect.value;
      if (topicSelect.options.length !== topics.length || topics.some((t, i) => topicSelect.options[i].value !== t)) {
        fill(topicSelect, topics.map((t) => h("option", { value: t }, t)));
        if (topics.includes(current)) topicSelect.value = current;
      }
    }
    return { root, refresh };
  };

  // ---- tasks

  views.tasks = () => {
    const body = h("div");
    const workers = h("div");
    const yaml = h("textarea", { testid: "task-create-yaml", spellcheck: "false",
      placeholder: "id: shop-to-pg\nsource: {kind: mariadb, host: 127.0.0.1, port: 3306, user: sluice, database: shop,\n         password: {env: SLUICE_SECRET_SHOP_DB}}\ntables: [customers, orders]\ntarget: postgresql://sluice@127.0.0.1:5432/shop" });
    const formError = h("p", { class: "form-error", testid: "task-create-error", hidden: true });
    const form = h("form", { testid: "task-create" }, yaml,
      h("div", { class: "actions" },
        h("button", { type: "submit", class: "primary", disabled: !canOperate(), testid: "task-create-submit" }, "Create task"),
        roleNote()),
      formError);
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      formError.hidden = true;
      const created = await act("Create task", async () => {
        try {
          return await api("POST", "/tasks", yaml.value, "application/yaml");
        } catch (ex) {
          if (ex instanceof ApiError) {
            formError.textContent = ex.field ? `${ex.field}: ${ex.message}` : ex.message;
            formError.hidden = false;
          }
          throw ex;
        }
      });
      if (created) { yaml.value = ""; location.hash = `#/tasks/${encodeURIComponent(created.id)}`; }
    });
    const root = h("div", {}, h("div", { class: "page-head" }, h("h1", {}, "Tasks")), body,
      h("h2", {}, "Workers"), workers,
      h("details", { class: "panel", style: "margin-top:20px" }, h("summary", {}, "New task (YAML definition)"), form));

    async function refresh() {
      const [ts, ws] = await Promise.all([get("/tasks"), get("/workers")]);
      fill(body, tasksTable(ts));
      fill(workers, table(["Worker", "Host", "Tasks"],
        (ws.members || []).map((w) => h("tr", { testid: "worker-row" }, td(w.worker), td(w.host),
          td((w.tasks || []).length ? (w.tasks || []).map((id, i) => [i ? ", " : "", h("a", { href: `#/tasks/${encodeURIComponent(id)}` }, id)]) : "—"))),
        `No workers in group ${ws.group || ""}.`));
    }
    return { root, refresh };
  };

  views.task = (taskId) => {
    const stateEl = h("span");
    const facts = h("dl", { class: "facts", testid: "task-facts" });
    const errorBox = h("div", { class: "error-box", testid: "task-error", hidden: true });
    const lagChart = chartPanel("task-lag-chart", "Lag (records), last hour");
    const lagSecondsChart = chartPanel("task-lag-seconds-chart", "Lag (seconds), last hour", seconds);
    const executions = h("div");
    const events = h("div");
    const offsets = h("div");
    const definition = h("pre", { class: "panel", testid: "task-definition" });
    const path = `/tasks/${encodeURIComponent(taskId)}`;

    const pause = actionButton("Pause", "task-pause", () => act(`Pause ${taskId}`, () => api("POST", `${path}/pause`)));
    const resume = actionButton("Resume", "task-resume", () => act(`Resume ${taskId}`, () => api("POST", `${path}/resume`)));
    const restart = actionButton("Restart", "task-restart", () => confirmDialog({
      title: `Restart ${taskId}?`,
      body: "The running execution stops and a new one starts with the next epoch, from where the target left off.",
      okLabel: "Restart",
      run: () => api("POST", `${path}/restart`, {}).then(() => { flash(`Restart ${taskId}: done.`, true); refreshNow(); }),
    }));
    const restartFrom = actionButton("Restart from position…", "task-restart-from", () => confirmDialog({
      title: `Restart ${taskId} from a source position?`,
      body: "Capture starts again at this position: changes after it are read again (the target applies them idempotently); changes before it are not read.",
      okLabel: "Restart from position", danger: true,
      fields: [{ name: "position", label: "Position (binlog file:position)", placeholder: "mysql-bin.000003:4", required: true }],
      run: (v) => api("POST", `${path}/restart`, { from_position: v.position })
        .then(() => { flash(`Restart ${taskId} from ${v.position}: done.`, true); refreshNow(); }),
    }), { danger: true });
    const del = actionButton("Delete", "task-delete", () => confirmDialog({
      title: `Delete task ${taskId}?`,
      body: "Its definition is removed and its execution stops. The topics and the target's tables stay.",
      okLabel: "Delete task", danger: true,
      run: () => api("DELETE", path).then(() => { flash(`Deleted task ${taskId}.`, true); location.hash = "#/tasks"; }),
    }), { danger: true });

    const root = h("div", {},
      h("div", { class: "page-head" }, h("span", { class: "crumb" }, h("a", { href: "#/tasks" }, "Tasks"), " /"),
        h("h1", { testid: "task-title" }, taskId), stateEl),
      h("div", { class: "actions", testid: "task-actions" }, pause, resume, restart, restartFrom, del, roleNote()),
      errorBox,
      h("div", { class: "grid2" }, lagChart.el, lagSecondsChart.el),
      h("div", { class: "grid2" },
        h("section", {}, h("h2", {}, "Status"), h("div", { class: "panel" }, facts)),
        h("section", {}, h("h2", {}, "Applied offsets"), offsets)),
      h("h2", {}, "Executions"), executions,
      h("h2", {}, "Events"), events,
      h("h2", {}, "Definition"), definition);

    async function refresh() {
      const [t, hist, rules] = await Promise.all([
        get(path), get(`${path}/lag-history`), get("/alarms/rules").catch(() => null),
      ]);
      // The task-lag rule's thresholds for this task, drawn on the charts as dashed lines.
      const own = (rules && rules.tasks && rules.tasks[taskId]) || {};
      const lagOn = rules && ((own.enabled || {})["task-lag"] ?? (rules.enabled || {})["task-lag"] ?? true);
      const pick = (k) => (lagOn ? own[k] ?? rules[k] : null);
      fill(stateEl, stateBadge(t.state, "task-state"));
      if (canOperate()) {
        pause.disabled = t.state === "paused";
        resume.disabled = t.state !== "paused";
      }
      errorBox.hidden = !t.error;
      errorBox.textContent = t.error || "";
      fill(facts,
        h("dt", {}, "Worker"), h("dd", {}, t.worker || "—"),
        h("dt", {}, "Epoch"), h("dd", { testid: "task-epoch" }, num(t.epoch)),
        h("dt", {}, "Execution"), h("dd", { class: "mono", testid: "task-execution" }, text(t.execution)),
        h("dt", {}, "Lag"), h("dd", { testid: "task-lag" }, t.lag_records === null || t.lag_records === undefined
          ? "— (no execution reports one)" : `${num(t.lag_records)} records · ${seconds(t.lag_seconds)}`),
        h("dt", {}, "Captured up to"), h("dd", { class: "mono" }, text(t.captured_position)),
        h("dt", {}, "Source"), h("dd", {}, text(t.source)),
        h("dt", {}, "Target"), h("dd", { class: "mono" }, text(t.target)),
        h("dt", {}, "Topics"), h("dd", { class: "mono" }, list(t.topics || [])),
        h("dt", {}, "Status updated"), h("dd", {}, t.updated ? `${when(t.updated)} (${ago(t.updated)})` : "—"),
        h("dt", {}, "Open alarms"), h("dd", { testid: "task-open-alarms" }, t.open_alarms ? h("a", { href: "#/alarms" }, badge(`${t.open_alarms} open`, "critical")) : "none"));
      const samples = hist.samples || [];
      // A sample without a number (no execution reported one) is a gap, not a zero.
      lagChart.update(samples.filter((x) => typeof x.lag_records === "number").map((x) => ({ t: x.t, v: x.lag_records })),
        { threshold: pick("task_lag_records") });
      lagSecondsChart.update(samples.filter((x) => typeof x.lag_seconds === "number").map((x) => ({ t: x.t, v: x.lag_seconds })),
        { threshold: pick("task_lag_seconds") });
      fill(offsets, table(["Partition", th("Next offset", "num")],
        Object.entries(t.applied_offsets || {}).map(([tp, o]) => h("tr", {}, td(h("span", { class: "mono" }, tp)), tdNum(num(o)))),
        "Nothing applied yet."));
      fill(executions, table(["Execution", th("Epoch", "num"), "Worker", "Started", "Ended", "Outcome", "Error"],
        (t.executions || []).map((x) => h("tr", { testid: "execution-row", class: x.error ? "row-critical" : "" },
          td(h("span", { class: "mono" }, text(x.execution))), tdNum(num(x.epoch)), td(x.worker || "—"),
          td(timeCell(x.started)), td(timeCell(x.ended)), td(x.outcome ? stateBadge(x.outcome) : "running"),
          td(x.error ? h("span", { class: "error-text" }, x.error) : ""))),
        "No executions yet."));
      fill(events, table(["When", "Event", "Detail"],
        (t.events || []).map((ev) => {
          const { kind, at, ...rest } = ev;
          return h("tr", { testid: "task-event" }, td(timeCell(at)), td(kind), td(h("code", {}, Object.keys(rest).length ? JSON.stringify(rest) : "")));
        }),
        "No events."));
      definition.textContent = JSON.stringify(t.definition ?? {}, null, 2);
    }
    return { root, refresh };
  };

  // ---- alarms

  const ALARM_TABS = ["open", "acknowledged", "resolved", "all"];

  views.alarms = () => {
    let tab = "open";
    const expanded = new Set(); // alarm ids whose details are shown: they stay open across polls
    const body = h("div");
    const tabs = h("div", { class: "tabs" }, ALARM_TABS.map((name) => h("button", {
      type: "button", testid: `alarms-tab-${name}`, class: name === tab ? "active" : "",
      onclick: (e) => {
        tab = name;
        for (const b of tabs.children) b.classList.toggle("active", b === e.currentTarget);
        refreshNow();
      },
    }, name[0].toUpperCase() + name.slice(1))));
    const root = h("div", {}, h("div", { class: "page-head" }, h("h1", {}, "Alarms"), roleNote()), tabs, body);

    async function refresh() {
      const asked = tab;
      const wanted = asked === "all" ? ALARM_TABS.slice(0, 3) : [asked];
      const lists = await Promise.all(wanted.map((st) => get(`/alarms?state=${st}`)));
      if (asked !== tab) return; // the tab changed while this answer was on its way: a newer poll draws it
      const alarms = lists.flat().sort((a, b) => (toDate(b.raised_at) || 0) - (toDate(a.raised_at) || 0));
      fill(body, table(["Severity", "State", "Alarm", "Subject", "Raised", "Handled", ""],
        alarms.map((a) => {
          const notes = a.notifications || [];
          const more = h("details", { testid: "alarm-details" },
            h("summary", {}, `details · ${notes.length} notification${notes.length === 1 ? "" : "s"}`),
            a.detail ? h("pre", { class: "mono", testid: "alarm-detail" },
              typeof a.detail === "object" ? JSON.stringify(a.detail, null, 2) : String(a.detail)) : null,
            notes.length ? table(["Webhook", "Event", "When", "Delivered", th("Attempts", "num"), "Error"],
              notes.map((n) => h("tr", { testid: "alarm-notification", data: { event: n.event, ok: n.ok } },
                td(h("span", { class: "mono" }, n.webhook)), td(n.event), td(timeCell(n.at)),
                td(stateBadge(n.ok ? "ok" : "failed")), tdNum(n.attempts), td(n.error || "")))) : null);
          if (expanded.has(a.id)) more.open = true;
          more.addEventListener("toggle", () => (more.open ? expanded.add(a.id) : expanded.delete(a.id)));
          const handled = a.state === "resolved" ? `resolved ${when(a.resolved_at)}`
            : a.state === "acknowledged" ? `by ${a.acknowledged_by || "?"} at ${when(a.acknowledged_at)}` : "";
          return h("tr", {
            testid: "alarm-row", class: a.state === "resolved" ? "" : a.severity === "critical" ? "row-critical" : "row-warning",
            data: { id: a.id, state: a.state, severity: a.severity, rule: a.rule, subject: a.subject },
          },
          td(stateBadge(a.severity)), td(stateBadge(a.state, "alarm-state")),
          td([h("div", { testid: "alarm-summary" }, a.summary), h("div", { class: "muted" }, `rule ${a.rule}`), more]),
          td(a.subject), td(timeCell(a.raised_at)), td(handled),
          td(a.state === "open" ? actionButton("Acknowledge", "alarm-ack", () => act(`Acknowledge alarm ${a.id}`,
            () => api("POST", `/alarms/${encodeURIComponent(a.id)}/acknowledge`))) : ""));
        }),
        tab === "all" ? "No alarms." : `No ${tab} alarms.`));
    }
    return { root, refresh };
  };

  // ---- audit

  views.audit = () => {
    const limit = h("select", { testid: "audit-limit" }, [50, 200, 1000].map((n) => h("option", { value: n }, `last ${n}`)));
    limit.addEventListener("change", () => refreshNow());
    const body = h("div");
    const root = h("div", {}, h("div", { class: "page-head" }, h("h1", {}, "Audit log"), limit), body);
    const plain = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
    /** One side of a change: key: value lines, the keys that changed marked. */
    const side = (v, other) => {
      if (v === null || v === undefined) return h("span", { class: "muted" }, "—");
      if (!plain(v)) return h("pre", {}, JSON.stringify(v, null, 1));
      return h("div", { class: "kv" }, Object.entries(v).map(([k, x]) => {
        const changed = plain(other) ? JSON.stringify(other[k]) !== JSON.stringify(x) : other !== undefined && other !== null;
        return h("div", { class: changed ? "changed" : "" }, h("span", { class: "k" }, `${k}: `), h("code", {}, JSON.stringify(x)));
      }));
    };
    async function refresh() {
      const asked = limit.value;
      const rows = await get(`/audit?limit=${asked}`);
      if (asked !== limit.value) return; // a newer poll asks for the new limit
      fill(body, table(["When", "User", "Action", "Target", "Before", "After"],
        rows.map((r) => h("tr", { testid: "audit-row", data: { id: r.id, user: r.user, action: r.action, target: r.target } },
          td(timeCell(r.at)), td(h("strong", { testid: "audit-user" }, r.user)), td(h("span", { testid: "audit-action" }, r.action)),
          td(h("span", { class: "mono", testid: "audit-target" }, text(r.target))), td(side(r.before, r.after)), td(side(r.after, r.before)))),
        "Nothing recorded yet."));
    }
    return { root, refresh };
  };

  views.notFound = () => ({
    root: h("div", {}, h("h1", {}, "Page not found"), h("p", {}, h("a", { href: "#/overview" }, "Back to the overview"))),
    refresh: async () => {},
  });

  // ---------------------------------------------------------------- routing and polling

  function route() {
    const parts = location.hash.replace(/^#\/?/, "").split("/").map((p) => decodeURIComponent(p));
    const [section, id] = [parts[0] || "overview", parts.slice(1).join("/")];
    const single = { topics: "topic", groups: "group", tasks: "task" };
    if (id && single[section]) return { nav: section, make: () => views[single[section]](id) };
    if (!id && views[section] && !Object.values(single).includes(section)) return { nav: section, make: views[section] };
    return { nav: null, make: views.notFound };
  }

  function mount() {
    if (!state.token) return;
    const r = route();
    state.generation += 1;
    for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.route === r.nav);
    state.view = r.make();
    fill($("view"), state.view.root);
    document.title = `Sluice · ${r.nav || "not found"}`;
    refreshNow();
  }

  function schedule(delay) {
    clearTimeout(state.timer);
    state.timer = setTimeout(poll, delay);
  }
  function refreshNow() { schedule(0); }

  async function poll() {
    if (!state.token || !state.view) return;
    if (state.polling) { state.pollAgain = true; return; }
    state.polling = true;
    const gen = state.generation;
    try {
      await Promise.all([state.view.refresh(), refreshAlarmCount()]);
      if (gen === state.generation) markOk();
    } catch (e) {
      if (gen === state.generation) pollFailed(e);
      else state.pollAgain = true;
    } finally {
      state.polling = false;
    }
    if (!state.token) return;
    schedule(state.pollAgain ? 0 : POLL_MS);
    state.pollAgain = false;
  }

  async function refreshAlarmCount() {
    let open;
    try {
      open = await get("/alarms?state=open");
    } catch (e) {
      if (e instanceof Unreachable) throw e;
      open = []; // alarms not available on this manager: the pages say so where it matters
    }
    const el = $("alarm-count");
    el.hidden = !open.length;
    el.textContent = String(open.length);
    el.className = `count ${open.some((a) => a.severity === "critical") ? "" : "warning"}`;
  }

  // ---------------------------------------------------------------- login, user menu

  function showLogin(message) {
    clearTimeout(state.timer);
    state.token = null;
    state.view = null;
    STORE.removeItem("sluice.token");
    $("app").hidden = true;
    $("dialog-backdrop").hidden = true;
    $("login").hidden = false;
    const err = $("login-error");
    err.textContent = message || "";
    err.hidden = !message;
    $("login-password").value = "";
    $("login-user").focus();
  }

  function showApp() {
    $("login").hidden = true;
    $("app").hidden = false;
    $("user-menu-button").textContent = `${state.user} ▾`;
    fill($("user-menu-who"), "Signed in as ", h("strong", { testid: "user-name" }, state.user), " · ",
      h("span", { testid: "user-role" }, state.role));
    if (!location.hash || location.hash === "#" || location.hash === "#/") location.hash = "#/overview";
    mount();
  }

  $("login-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const err = $("login-error");
    err.hidden = true;
    const button = $("login-submit");
    button.disabled = true;
    try {
      const r = await api("POST", "/login", { user: $("login-user").value.trim(), password: $("login-password").value });
      state.token = r.token;
      state.user = r.user;
      state.role = r.role;
      STORE.setItem("sluice.token", r.token);
      STORE.setItem("sluice.user", r.user);
      STORE.setItem("sluice.role", r.role);
      showApp();
    } catch (ex) {
      err.textContent = ex instanceof ApiError && (ex.status === 401 || ex.status === 429)
        ? `${ex.message.charAt(0).toUpperCase()}${ex.message.slice(1)}.` : `Could not log in: ${ex.message}`;
      err.hidden = false;
    } finally {
      button.disabled = false;
    }
  });

  const menu = $("user-menu-panel");
  $("user-menu-button").addEventListener("click", (e) => {
    e.stopPropagation();
    menu.hidden = !menu.hidden;
    $("user-menu-button").setAttribute("aria-expanded", String(!menu.hidden));
  });
  document.addEventListener("click", (e) => { if (!menu.contains(e.target)) menu.hidden = true; });
  $("logout").addEventListener("click", () => {
    menu.hidden = true;
    // End the token on the manager too (every manager refuses it from now on), not only here;
    // the page logs out whether or not the manager answers.
    if (state.token) {
      fetch(API + "/logout", { method: "POST", headers: { Authorization: `Bearer ${state.token}` },
        keepalive: true, cache: "no-store" }).catch(() => {});
    }
    STORE.removeItem("sluice.user");
    STORE.removeItem("sluice.role");
    showLogin("");
  });

  window.addEventListener("hashchange", mount);

  async function start() {
    if (!state.token) { showLogin(""); return; }
    try {
      const me = await get("/me"); // the role may have changed since the token was stored
      state.user = me.user;
      state.role = me.role;
      STORE.setItem("sluice.role", me.role);
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) return;
    }
    showApp();
  }
  start();
})();
