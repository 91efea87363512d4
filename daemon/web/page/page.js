// fredica's page: plain JavaScript, no build step, nothing loaded from elsewhere.
// Every request carries the bearer token kept in this tab's sessionStorage. Live changes come
// from /api/v1/events (server-sent events, read through fetch so that the token goes with it).
"use strict";

const TOKEN_KEY = "fredica-token";
const PAGE_SIZE = 50;
const REFRESH_GAP = 2000; // ms: a change that needs the lists read again waits at most this (progress never does)
const ACTIONS = ["pause", "resume", "cancel", "retry", "hold", "release"];
const TERMINAL = new Set(["completed", "failed", "cancelled"]);

const state = {
  operations: {}, types: {}, filters: { status: "", type: "", run: "" },
  pages: [], // the `before` seq of each page shown so far (null: the newest)
  rows: new Map(), runsLimit: 20, ready: null, streams: 0, logTask: null, logAbort: null, refreshTimer: null, lastCounts: null,
};

const $ = (id) => document.getElementById(id);
const short = (id) => (id || "").slice(0, 8);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value !== null && value !== undefined && value !== false) node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children) node.append(child);
  return node;
}

function ago(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0");
  if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor(s / 60) % 60).padStart(2, "0");
  return Math.floor(s / 86400) + "d";
}

// As SPEC §3 shows them: pending and claimed are waiting, a paused running task is paused.
function shownStatus(t) {
  if (t.status === "pending" || t.status === "claimed") return t.is_held || t.held ? "held" : "waiting";
  if (t.status === "running" && t.is_paused) return "paused";
  return t.status;
}

function say(text, isError) {
  const m = $("message");
  m.textContent = text || "";
  m.className = "message" + (isError ? " error" : "");
}

// --- the token and requests ----------------------------------------------------------------

function token() { return sessionStorage.getItem(TOKEN_KEY); }

function askToken(why) {
  $("login-error").textContent = why || "";
  if (!$("login").open) $("login").showModal();
  $("token").focus();
}

class Refused extends Error {
  constructor(status, error) { super(error.message); this.status = status; this.kind = error.kind; }
}

async function request(method, path, body) {
  const headers = { Authorization: "Bearer " + token() };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const reply = await res.json().catch(() => ({ ok: false, error: { kind: "HTTP", message: res.statusText } }));
  if (res.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    askToken("That token was refused.");
  }
  if (!reply.ok) throw new Refused(res.status, reply.error);
  return reply.data;
}

const get = (path) => request("GET", path);

// An acting operation, wired generically: one that takes `ids` gets [id], one that takes `id` gets id.
async function act(op, id) {
  const args = state.operations[op] ? state.operations[op].arguments : {};
  const body = "ids" in args ? { ids: [String(id)] } : { id: id };
  try {
    const data = await request("POST", "/api/v1/" + op, body);
    const refused = data && Array.isArray(data.results) ? data.results.filter((r) => !r.ok) : [];
    if (refused.length) say(refused.map((r) => r.message).join("; "), true);
    else say(op + " " + short(typeof id === "string" ? id : String(id)) + ": done");
  } catch (e) {
    say(e.message, true);
  }
  refreshSoon(0);
}

// --- live events -----------------------------------------------------------------------------

async function follow(path, onEvent, signal) {
  const res = await fetch(path, { headers: { Authorization: "Bearer " + token() }, signal });
  if (res.status === 401) { askToken("That token was refused."); throw new Error("unauthorized"); }
  if (!res.ok) throw new Error("events: HTTP " + res.status);
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) event = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data) onEvent(event, JSON.parse(data));
    }
  }
}

async function liveLoop() {
  for (;;) {
    if (token()) {
      try {
        await follow("/api/v1/events", onLive);
      } catch (e) { /* reconnect below */ }
    }
    $("live").textContent = "○ offline";
    $("live").className = "live";
    await new Promise((r) => setTimeout(r, 1000));
  }
}

function onLive(event, data) {
  if (event === "hello") {
    $("live").textContent = "● live";
    $("live").className = "live on";
    // Connected again (the daemon restarted, say): what changed meanwhile is read once.
    if (state.streams++ > 0) refreshSoon(0);
    return;
  }
  if (event === "resync") { refreshSoon(0); return; }
  if (event !== "tasks") return;
  let unseen = false;
  for (const t of data.tasks || []) {
    const row = state.rows.get(t.id);
    if (row) updateRow(row, t);
    else unseen = true;
  }
  const countsChanged = data.counts && JSON.stringify(data.counts) !== JSON.stringify(state.lastCounts);
  if (data.counts) state.lastCounts = data.counts;
  if (data.resync || countsChanged || (unseen && state.pages.length === 1)) refreshSoon();
}

function refreshSoon(delay) {
  if (state.refreshTimer !== null) return;
  state.refreshTimer = setTimeout(() => { state.refreshTimer = null; refresh(); }, delay === undefined ? REFRESH_GAP : delay);
}

// --- the views -------------------------------------------------------------------------------

async function refresh() {
  if (!token()) return;
  try {
    await Promise.all([loadStatus(), loadQueues(), loadRestarts(), loadRuns(), loadTasks()]);
  } catch (e) {
    if (!(e instanceof Refused && e.status === 401)) say(e.message, true);
  }
}

async function loadStatus() {
  const s = await get("/api/v1/status");
  const c = s.counts;
  const waiting = (c.pending || 0) + (c.claimed || 0);
  $("summary").textContent = `pid ${s.pid} · up ${ago(s.uptime)} · workers ${s.busy_workers}/${s.max_workers} · ` +
    `${waiting} waiting · ${c.running || 0} running · ${c.completed || 0} completed · ${c.failed || 0} failed · ` +
    `${c.cancelled || 0} cancelled` + (s.database_fault ? " · " + s.database_fault : "");
  state.lastCounts = c;
}

async function loadQueues() {
  const rows = await get("/api/v1/queues");
  const body = $("queues").tBodies[0];
  body.replaceChildren(...rows.map((q) => {
    const bar = el("span", { class: "bar" + (q.paused ? " paused" : "") }, el("span"));
    bar.firstChild.style.width = (q.workers ? Math.min(100, 100 * q.busy / q.workers) : 0) + "%";
    return el("tr", { "data-queue": q.name }, el("td", { text: q.name }), el("td", {}, bar), el("td", { text: q.busy }),
      el("td", { text: q.workers }), el("td", { text: q.waiting }), el("td", { text: q.paused ? "paused" : "claiming" }));
  }));
}

async function loadRestarts() {
  const rows = await get("/api/v1/restarts");
  $("restarts-count").textContent = rows.length ? `(${rows.length} to review)` : "(none)";
  const now = Date.now() / 1000;
  $("restarts").tBodies[0].replaceChildren(...rows.map((e) => el("tr", { "data-entry": e.id },
    el("td", { text: e.id }), el("td", { class: "id", text: short(e.task_id), title: e.task_id }),
    el("td", { text: e.task_type }), el("td", { class: "id", text: short(e.workflow_run_id) }),
    el("td", { text: e.status_at_restart }), el("td", { text: (e.progress || 0) + "%" }),
    el("td", { text: ago(now - e.created_at) + " ago" }),
    el("td", { class: "actions" },
      el("button", { type: "button", "data-op": "restarts_recreate", onclick: () => act("restarts_recreate", e.id) }, "recreate"),
      el("button", { type: "button", "data-op": "restarts_dismiss", onclick: () => act("restarts_dismiss", e.id) }, "dismiss")))));
}

async function loadRuns() {
  const rows = await get("/api/v1/runs?limit=" + state.runsLimit);
  const now = Date.now() / 1000;
  $("more-runs").hidden = rows.length < state.runsLimit;
  $("runs").tBodies[0].replaceChildren(...rows.map((r) => el("tr", { "data-run": r.id, class: state.filters.run && r.id.startsWith(state.filters.run) ? "selected" : "" },
    el("td", {}, el("a", { class: "id", title: r.id, onclick: () => setFilter("run", r.id) }, short(r.id))),
    el("td", { text: r.template }), el("td", { class: "status " + r.status, text: r.status }),
    el("td", { text: `${r.done_tasks}/${r.total_tasks}` }), el("td", { text: ago(now - r.created_at) }),
    el("td", { class: "actions" }, el("button", { type: "button", "data-op": "cancel", disabled: r.completed_at !== null,
      onclick: () => act("cancel", r.id) }, "cancel")))));
}

function tasksQuery(before) {
  const q = new URLSearchParams({ limit: PAGE_SIZE });
  for (const [k, v] of Object.entries(state.filters)) if (v) q.set(k, v);
  if (before !== null && before !== undefined) q.set("before", before);
  return "/api/v1/page/tasks?" + q;
}

async function loadTasks() {
  if (!state.pages.length) state.pages = [null];
  const before = state.pages[state.pages.length - 1];
  let data;
  try {
    data = await get(tasksQuery(before));
  } catch (e) {
    $("tasks").tBodies[0].replaceChildren(el("tr", {}, el("td", { colspan: 8, class: "error", text: e.message })));
    throw e;
  }
  await state.ready;
  state.rows.clear();
  const rows = data.tasks.map((t) => { const row = taskRow(t); state.rows.set(t.id, row); return row; });
  $("tasks").tBodies[0].replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 8, text: "no tasks" }))]));
  if (!performance.getEntriesByName("tasks-drawn").length) performance.mark("tasks-drawn"); // benchmarks/http_api.py
  const first = (state.pages.length - 1) * PAGE_SIZE;
  $("tasks-count").textContent = `(${data.total})`;
  $("page-label").textContent = data.total ? `${first + 1}–${first + data.tasks.length} of ${data.total}` : "";
  $("newer").disabled = state.pages.length === 1;
  $("older").disabled = first + data.tasks.length >= data.total;
  state.lastSeq = data.tasks.length ? data.tasks[data.tasks.length - 1].seq : null;
}

function taskRow(t) {
  const row = el("tr", { "data-id": t.id });
  const bar = el("span", { class: "bar" }, el("span"));
  const actions = el("td", { class: "actions" });
  for (const op of ACTIONS) {
    if (!state.operations[op]) continue; // an operation this daemon does not have: no button
    actions.append(el("button", { type: "button", "data-op": op, onclick: () => act(op, t.id) }, op));
  }
  actions.append(el("button", { type: "button", "data-op": "log", onclick: () => openLog(t.id) }, "log"));
  row.append(
    el("td", { class: "id", title: t.id, text: short(t.id) }), el("td", { text: t.type }),
    el("td", {}, el("a", { class: "id", title: t.workflow_run_id, onclick: () => setFilter("run", t.workflow_run_id) }, short(t.workflow_run_id))),
    el("td", { class: "status" }), el("td", {}, bar, el("span", { class: "progress-text" })),
    el("td", { text: t.priority }), el("td", { class: "age" }), actions);
  updateRow(row, t);
  return row;
}

function updateRow(row, t) {
  const shown = shownStatus(t);
  const cells = row.cells;
  cells[3].textContent = shown;
  cells[3].className = "status " + shown;
  row.dataset.status = shown;
  row.dataset.progress = t.progress;
  const bar = cells[4].firstChild;
  bar.className = "bar" + (shown === "paused" ? " paused" : t.status === "completed" ? " done" : t.status === "failed" ? " bad" : t.status === "cancelled" ? " off" : "");
  bar.firstChild.style.width = Math.max(0, Math.min(100, t.progress || 0)) + "%";
  const text = cells[4].lastChild;
  text.textContent = `${t.progress || 0}%` + (t.status_text ? " " + t.status_text : t.error_type ? " " + t.error_type : "");
  text.title = t.status_text || "";
  const now = Date.now() / 1000;
  cells[6].textContent = t.completed_at && t.started_at ? ago(t.completed_at - t.started_at) : ago(now - t.created_at);
  const enabled = {
    pause: t.status === "running" && !t.is_paused && !!t.is_pausable,
    resume: t.status === "running" && !!t.is_paused,
    cancel: !TERMINAL.has(t.status),
    retry: t.status === "failed" || t.status === "cancelled",
    hold: t.status === "pending" || t.status === "claimed",
    release: t.status === "pending" || t.status === "claimed",
  };
  for (const button of cells[7].querySelectorAll("button[data-op]")) {
    const op = button.dataset.op;
    if (op in enabled) button.disabled = !enabled[op];
    if (op === "pause") button.title = t.is_pausable ? "" : "this task's executor cannot pause";
  }
}

function setFilter(name, value) {
  state.filters[name] = value;
  $("filter-" + name).value = value;
  state.pages = [null];
  refreshSoon(0);
}

// --- a task's log, followed live ----------------------------------------------------------------

async function openLog(id) {
  if (state.logAbort) state.logAbort.abort();
  const abort = new AbortController();
  state.logAbort = abort;
  $("log-section").hidden = false;
  $("log-task").textContent = short(id);
  $("log-task").title = id;
  const pre = $("log");
  pre.textContent = "";
  try {
    await follow("/api/v1/page/log?id=" + encodeURIComponent(id), (event, data) => {
      const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      if (event === "log") pre.append(data.text);
      else if (event === "end") pre.append("\n— the task has ended —\n");
      if (atEnd) pre.scrollTop = pre.scrollHeight;
    }, abort.signal);
  } catch (e) {
    if (!abort.signal.aborted) pre.append("\n(" + e.message + ")\n");
  }
}

// --- start -------------------------------------------------------------------------------------

async function loadMeta() {
  const [operations, types] = await Promise.all([get("/api/v1/page/operations"), get("/api/v1/types")]);
  state.operations = operations;
  state.types = Object.fromEntries(types.map((t) => [t.type, t]));
  $("filter-type").replaceChildren(el("option", { value: "" }, "any"), ...types.map((t) => el("option", {}, t.type)));
  $("filter-type").value = state.filters.type;
}

// Everything is asked for at once: the rows wait only for the operations (their buttons).
function start() {
  state.ready = loadMeta();
  state.ready.catch((e) => { if (!(e instanceof Refused && e.status === 401)) say(e.message, true); });
  refresh();
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", () => {
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    start();
  });
  $("forget").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); askToken(); });
  $("filter-status").addEventListener("change", (e) => setFilter("status", e.target.value));
  $("filter-type").addEventListener("change", (e) => setFilter("type", e.target.value));
  $("filter-run").addEventListener("change", (e) => setFilter("run", e.target.value.trim()));
  $("clear-filters").addEventListener("click", () => { for (const name of ["status", "type", "run"]) setFilter(name, ""); });
  $("older").addEventListener("click", () => { state.pages.push(state.lastSeq); refreshSoon(0); });
  $("newer").addEventListener("click", () => { if (state.pages.length > 1) state.pages.pop(); refreshSoon(0); });
  $("more-runs").addEventListener("click", () => { state.runsLimit += 20; loadRuns(); });
  $("log-close").addEventListener("click", () => { if (state.logAbort) state.logAbort.abort(); $("log-section").hidden = true; });
  if (token()) start(); else askToken();
  liveLoop();
});
