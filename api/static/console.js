// tokenrelay web console: a chat playground that streams through the public API, a
// cluster view that polls GET /v1/cluster, and the key's batches from GET /v1/batches.
// Plain browser JavaScript, no build step.
"use strict";

const KEY_STORAGE = "tokenrelay.apiKey";
const CLUSTER_POLL_MS = 1000;
const BATCH_PAGE_SIZE = 10;
const STOP_GRACE_MS = 5000;
const TERMINAL = new Set(["succeeded", "failed", "cancelled", "expired"]);
// Sent with the views' periodic refreshes: the gateway logs them at DEBUG, not INFO.
const POLL_HEADERS = { "X-Tokenrelay-Poll": "1" };

const $ = (id) => document.getElementById(id);
const state = {
  messages: [], // the conversation so far: {role, content}
  run: null, // the reply being streamed: see send()
  lastJobId: null, // the job of the latest reply, whose tok/s the cluster view reports
  keyRequired: false,
  batchCursors: [null], // `after` of each batch page seen, newest page first
};

// ---- API access ---------------------------------------------------------------------

function apiUrl(path) {
  // Relative to the page (/ui/), so the console also works behind a path prefix.
  return new URL(`../v1/${path}`, window.location.href).toString();
}

function apiKey() {
  return window.sessionStorage.getItem(KEY_STORAGE) || "";
}

function headers(extra = {}) {
  const result = { ...extra };
  const key = apiKey();
  if (key) result.Authorization = `Bearer ${key}`;
  return result;
}

function api(method, path, extraHeaders = {}) {
  return fetch(apiUrl(path), { method, headers: headers(extraHeaders) });
}

function seconds(value) {
  const n = Number(value);
  return `${n} second${n === 1 ? "" : "s"}`;
}

// A refused request as a person should read it: what happened and what to do.
async function describeError(response) {
  let error = {};
  try {
    error = (await response.json()).error || {};
  } catch (_) {
    // not JSON: fall back to the status line
  }
  const detail = error.message || `${response.status} ${response.statusText}`;
  const retry = response.headers.get("Retry-After");
  const retryText = retry ? `Try again in ${seconds(retry)}.` : "Try again shortly.";
  switch (response.status) {
    case 401:
      showKeyForm();
      return apiKey()
        ? `The gateway refused this API key (${detail}). Check the key above.`
        : "This gateway needs an API key: enter it above.";
    case 403:
      return `This API key may not do that: ${detail}`;
    case 429:
      return `Too many requests for this API key right now. ${retryText} (${detail})`;
    case 503:
      if (error.code === "cluster_overloaded") {
        return `The cluster is at capacity: every slot is taken by other requests. ${retryText}`;
      }
      return `The gateway is unavailable (${detail}). ${retryText}`;
    default:
      return `Request failed: ${detail}`;
  }
}

// ---- API key ------------------------------------------------------------------------

function showKeyForm() {
  state.keyRequired = true;
  $("key-form").hidden = false;
}

function setupKeyForm() {
  $("api-key").value = apiKey();
  if (apiKey()) $("key-form").hidden = false;
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("api-key").value.trim();
    if (key) window.sessionStorage.setItem(KEY_STORAGE, key);
    else window.sessionStorage.removeItem(KEY_STORAGE);
    hideNotice();
    state.batchCursors = [null];
    loadModels();
    pollViews();
  });
}

// ---- Playground ---------------------------------------------------------------------

function notice(text) {
  $("notice").textContent = text;
  $("notice").hidden = false;
}

function hideNotice() {
  $("notice").hidden = true;
}

async function loadModels() {
  let response;
  try {
    response = await api("GET", "models");
  } catch (err) {
    notice(`Cannot reach the gateway: ${err.message}`);
    return;
  }
  if (!response.ok) {
    notice(await describeError(response));
    return;
  }
  const select = $("model");
  const previous = select.value;
  select.replaceChildren();
  for (const model of (await response.json()).data) {
    select.append(new Option(model.id, model.id, false, model.id === previous));
  }
}

function numberField(id) {
  const raw = $(id).value.trim();
  return raw === "" ? null : Number(raw);
}

function requestBody(messages) {
  const body = {
    model: $("model").value,
    messages,
    stream: true,
    stream_options: { include_usage: true },
  };
  const system = $("system").value.trim();
  if (system) body.messages = [{ role: "system", content: system }, ...messages];
  for (const [id, field] of [
    ["temperature", "temperature"],
    ["max-tokens", "max_tokens"],
    ["min-tokens", "min_tokens"],
    ["seed", "seed"],
  ]) {
    const value = numberField(id);
    if (value !== null) body[field] = value;
  }
  return body;
}

function addBubble(role, text) {
  const bubble = document.createElement("article");
  bubble.className = `msg ${role}`;
  const who = document.createElement("header");
  who.textContent = role;
  const body = document.createElement("div");
  body.className = "body";
  body.textContent = text;
  bubble.append(who, body);
  $("conversation").append(bubble);
  return bubble;
}

function setStatus(text, kind = "") {
  $("status").textContent = text;
  $("status").className = kind;
}

function showStats(run) {
  $("ttft").textContent =
    run.firstTokenAt === null ? "–" : `${Math.round(run.firstTokenAt - run.sentAt)} ms`;
  // Until the final usage arrives, tokens are estimated by stream chunks (a chunk may hold
  // several tokens).
  const tokens = run.usage ? run.usage.completion_tokens : run.chunks;
  $("tokens").textContent = run.usage ? String(tokens) : tokens ? `~${tokens}` : "–";
}

// Tokens per second has one definition, the gateway's (`tokens_per_s` of GET /v1/cluster:
// completion tokens over the job's run time, api/cluster_view.py): the playground shows its
// job's figure from the cluster view, as the recent jobs table does.
function tokensPerSecond(job) {
  return job.tokens_per_s === null ? "–" : job.tokens_per_s.toFixed(1);
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

async function send(event) {
  event.preventDefault();
  if (state.run) return;
  const text = $("message").value.trim();
  if (!$("model").value) {
    notice("No model to send to: the model list did not load (gateway down, or a wrong API key?).");
    return;
  }
  if (!text) return;
  hideNotice();
  const messages = [...state.messages, { role: "user", content: text }];
  const run = {
    controller: new AbortController(),
    jobId: null,
    sentAt: performance.now(),
    firstTokenAt: null,
    chunks: 0,
    usage: null,
    text: "",
    outcome: null, // finish reason, or the error code the stream ended with
    stopRequested: false,
    stopTimer: null,
  };
  state.run = run;
  state.lastJobId = null;
  setBusy(true);
  setStatus("sending…");
  for (const id of ["job-id", "ttft", "tokens", "tps"]) $(id).textContent = "–";
  try {
    const response = await fetch(apiUrl("chat/completions"), {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify(requestBody(messages)),
      signal: run.controller.signal,
    });
    if (!response.ok) {
      setStatus(`refused (${response.status})`, "bad");
      notice(await describeError(response));
      return;
    }
    $("message").value = "";
    addBubble("user", text);
    run.body = addBubble("assistant", "").querySelector(".body");
    run.body.classList.add("streaming");
    setStatus("streaming…", "live");
    await readStream(response, run);
    messages.push({ role: "assistant", content: run.text });
    state.messages = messages;
  } catch (err) {
    if (err.name !== "AbortError") {
      setStatus("error", "bad");
      notice(`The stream broke off: ${err.message}`);
    }
  } finally {
    clearTimeout(run.stopTimer);
    if (run.body) run.body.classList.remove("streaming");
    state.run = null;
    setBusy(false);
    await finish(run);
  }
}

async function readStream(response, run) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data === "") continue; // a `: ping` comment
      if (data === "[DONE]") return;
      onChunk(JSON.parse(data), run);
    }
  }
}

function onChunk(chunk, run) {
  if (chunk.error) {
    run.outcome = chunk.error.code || "error";
    if (!run.stopRequested) notice(`The job ended with an error: ${chunk.error.message}`);
    return;
  }
  if (run.jobId === null && typeof chunk.id === "string") {
    run.jobId = chunk.id.replace(/^chatcmpl-/, "");
    state.lastJobId = run.jobId;
    $("job-id").textContent = run.jobId;
  }
  if (chunk.usage) run.usage = chunk.usage;
  const choice = chunk.choices && chunk.choices[0];
  if (choice) {
    const content = choice.delta && choice.delta.content;
    if (content) {
      if (run.firstTokenAt === null) run.firstTokenAt = performance.now();
      run.chunks += 1;
      run.text += content;
      run.body.textContent = run.text;
      run.body.scrollIntoView({ block: "nearest" });
    }
    if (choice.finish_reason) run.outcome = choice.finish_reason;
  }
  showStats(run);
}

async function stop() {
  const run = state.run;
  if (!run || run.stopRequested) return;
  run.stopRequested = true;
  $("stop").disabled = true;
  setStatus("stopping…", "live");
  if (run.jobId === null) {
    run.controller.abort(); // not admitted yet, or no chunk yet: dropping the request cancels it
    return;
  }
  try {
    const response = await api("DELETE", `jobs/${run.jobId}`);
    if (!response.ok) notice(await describeError(response));
  } catch (err) {
    notice(`Could not cancel the job: ${err.message}`);
  }
  // The stream ends by itself with a `cancelled` error event; if it does not, drop it (the
  // gateway also cancels a job whose streaming client disconnects).
  run.stopTimer = setTimeout(() => run.controller.abort(), STOP_GRACE_MS);
}

// The final word on a run comes from the job record, so a stop shows what really happened.
async function finish(run) {
  showStats(run);
  if (run.jobId === null) {
    if (run.stopRequested) setStatus("stopped before it started");
    return;
  }
  let status = run.outcome;
  if (run.stopRequested || run.outcome === null) {
    const record = await finalRecord(run.jobId);
    status = record.status;
    if (record.usage) {
      run.usage = record.usage; // exact counts, also for a job stopped mid-stream
      showStats(run);
    }
  }
  const labels = {
    stop: ["done", "ok"],
    length: ["done (max tokens)", "ok"],
    succeeded: ["done", "ok"],
    cancelled: ["cancelled", "warn"],
  };
  const [text, kind] = labels[status] || [status || "ended", "bad"];
  setStatus(text, kind);
  pollViews();
}

// The job's record once it is terminal (a running job stops at its next decoding step).
async function finalRecord(jobId) {
  for (let attempt = 0; attempt < 20; attempt += 1) {
    try {
      const response = await api("GET", `jobs/${jobId}`);
      if (!response.ok) return { status: `unknown (${response.status})` };
      const record = await response.json();
      if (TERMINAL.has(record.status)) return record;
    } catch (_) {
      return { status: "unknown" };
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  return { status: "stopping" };
}

function setupPlayground() {
  $("chat-form").addEventListener("submit", send);
  $("stop").addEventListener("click", stop);
  $("clear").addEventListener("click", () => {
    state.messages = [];
    $("conversation").replaceChildren();
  });
  $("message").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      $("chat-form").requestSubmit();
    }
  });
}

// ---- Cluster view -------------------------------------------------------------------

let clusterTimer = null;

async function pollViews() {
  clearTimeout(clusterTimer);
  try {
    if (!document.hidden) await Promise.all([refreshCluster(), refreshBatches()]);
  } finally {
    clusterTimer = setTimeout(pollViews, CLUSTER_POLL_MS);
  }
}

// Show `text` in the notice `box`.
function showIn(box, text) {
  box.textContent = text;
  box.hidden = false;
}

// `api(method, path)`'s response, or null once `box` says the gateway cannot be reached.
async function reach(box, method, path, extraHeaders = {}) {
  try {
    return await api(method, path, extraHeaders);
  } catch (err) {
    showIn(box, `Cannot reach the gateway: ${err.message}`);
    return null;
  }
}

async function refreshCluster() {
  const box = $("cluster-notice");
  const response = await reach(box, "GET", "cluster?limit=15", POLL_HEADERS);
  if (response === null) return;
  if (response.status === 401 || response.status === 403) {
    showKeyForm();
    showIn(box, "The cluster view needs an admin API key (TOKENRELAY_ADMIN_API_KEYS).");
    return;
  }
  if (!response.ok) {
    showIn(box, await describeError(response));
    return;
  }
  box.hidden = true;
  renderCluster(await response.json());
}

function cell(text, className = "") {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function row(...cells) {
  const tr = document.createElement("tr");
  tr.append(...cells);
  return tr;
}

function duration(value) {
  if (value === null || value === undefined) return "–";
  return value < 1 ? `${Math.round(value * 1000)} ms` : `${value.toFixed(1)} s`;
}

function shortId(id) {
  return id.length > 10 ? id.slice(0, 8) + "…" : id;
}

function renderCluster(view) {
  $("cluster-updated").textContent = `updated ${new Date(view.now * 1000).toLocaleTimeString()}`;
  $("inflight").textContent = String(view.in_flight);
  $("max-inflight").textContent = String(view.max_inflight);
  const share = Math.min(1, view.in_flight / view.max_inflight);
  $("inflight-bar").style.width = `${(share * 100).toFixed(1)}%`;
  $("inflight-bar").className = share >= 1 ? "full" : "";

  $("queues").tBodies[0].replaceChildren(
    ...view.queues.map((q) => row(cell(q.name), cell(String(q.queued), "num")))
  );

  const workers = view.workers.map((w) => {
    const age =
      w.last_heartbeat === null ? "–" : `${Math.max(0, view.now - w.last_heartbeat).toFixed(0)} s ago`;
    const running = cell(w.running.map(shortId).join(" ") || "–", "ids");
    running.title = w.running.join("\n");
    return row(
      cell(w.name),
      cell(w.model),
      cell(w.state, `state ${w.state}`),
      cell(`${w.running.length} / ${w.capacity ?? "?"}`, "num"),
      running,
      cell(age, "num")
    );
  });
  $("workers").tBodies[0].replaceChildren(
    ...(workers.length ? workers : [row(cell("no live workers", "empty"))])
  );

  const rejections = Object.entries(view.rejections);
  $("rejections").replaceChildren(
    ...(rejections.length
      ? rejections.map(([type, count]) => {
          const li = document.createElement("li");
          li.textContent = `${type}: ${count}`;
          return li;
        })
      : [Object.assign(document.createElement("li"), { textContent: "none", className: "empty" })])
  );

  const current = state.run && state.run.jobId;
  const jobs = view.recent_jobs.map((job) => {
    const id = cell(shortId(job.id), "ids");
    id.title = job.id;
    const tokens =
      job.completion_tokens === null ? "–" : `${job.prompt_tokens} → ${job.completion_tokens}`;
    const tr = row(
      id,
      cell(job.status, `status ${job.status}`),
      cell(duration(job.queue_wait_s), "num"),
      cell(duration(job.run_s), "num"),
      cell(tokens, "num"),
      cell(tokensPerSecond(job), "num tps"),
      cell(job.error_type || job.finish_reason || "")
    );
    tr.dataset.jobId = job.id;
    if (job.id === current) tr.className = "mine";
    if (job.id === state.lastJobId) $("tps").textContent = tokensPerSecond(job);
    return tr;
  });
  $("recent-jobs").tBodies[0].replaceChildren(
    ...(jobs.length ? jobs : [row(cell("no jobs yet", "empty"))])
  );
}

// ---- Batches ------------------------------------------------------------------------

async function refreshBatches() {
  const box = $("batches-notice");
  const after = state.batchCursors[state.batchCursors.length - 1];
  const query = new URLSearchParams({ limit: String(BATCH_PAGE_SIZE) });
  if (after !== null) query.set("after", after);
  const response = await reach(box, "GET", `batches?${query}`, POLL_HEADERS);
  if (response === null) return;
  if (!response.ok) {
    showIn(
      box,
      response.status === 401
        ? "Enter an API key above to see its batches."
        : await describeError(response),
    );
    return;
  }
  const page = await response.json();
  // A page asked for before Older / Newer was clicked is no longer the one on show.
  if (state.batchCursors[state.batchCursors.length - 1] !== after) return;
  box.hidden = true;
  renderBatches(page);
}

function fileLink(fileId, label, name) {
  const link = document.createElement("a");
  link.href = apiUrl(`files/${fileId}/content`);
  link.textContent = label;
  link.title = `${name} (${fileId})`;
  link.className = label;
  link.dataset.fileId = fileId;
  link.addEventListener("click", (event) => {
    event.preventDefault();
    download(fileId, name);
  });
  return link;
}

// The content needs the API key, which a plain link cannot send: fetch it, then save it.
async function download(fileId, name) {
  const box = $("batches-notice");
  const response = await reach(box, "GET", `files/${fileId}/content`);
  if (response === null) return;
  if (!response.ok) {
    showIn(box, await describeError(response));
    return;
  }
  const url = URL.createObjectURL(await response.blob());
  const save = Object.assign(document.createElement("a"), { href: url, download: name });
  document.body.append(save);
  save.click();
  save.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

function renderBatches(page) {
  const rows = page.data.map((batch) => {
    const id = cell(shortId(batch.id.replace(/^batch_/, "")), "ids");
    id.title = batch.id;
    const counts = batch.request_counts;
    const files = document.createElement("td");
    files.className = "files";
    if (batch.output_file_id) {
      files.append(fileLink(batch.output_file_id, "output", `${batch.id}_output.jsonl`));
    }
    if (batch.error_file_id) {
      files.append(fileLink(batch.error_file_id, "errors", `${batch.id}_error.jsonl`));
    }
    if (!files.childElementCount) files.textContent = "–";
    const tr = row(
      id,
      cell(batch.status, `status ${batch.status}`),
      cell(batch.endpoint),
      cell(String(counts.total), "num count-total"),
      cell(String(counts.completed), "num count-completed"),
      cell(String(counts.failed), "num count-failed"),
      cell(new Date(batch.created_at * 1000).toLocaleString()),
      files
    );
    tr.dataset.batchId = batch.id;
    return tr;
  });
  $("batch-list").tBodies[0].replaceChildren(
    ...(rows.length ? rows : [row(cell("no batches", "empty"))])
  );
  const older = page.has_more ? page.last_id : null;
  $("batches-older").disabled = older === null;
  $("batches-older").dataset.after = older || "";
  $("batches-newer").disabled = state.batchCursors.length === 1;
  $("batches-page").textContent = `page ${state.batchCursors.length}`;
}

function setupBatches() {
  $("batches-older").addEventListener("click", () => {
    const after = $("batches-older").dataset.after;
    if (!after) return;
    state.batchCursors.push(after);
    refreshBatches();
  });
  $("batches-newer").addEventListener("click", () => {
    if (state.batchCursors.length > 1) state.batchCursors.pop();
    refreshBatches();
  });
}

document.addEventListener("visibilitychange", () => {
  if (!document.hidden) pollViews();
});

setupKeyForm();
setupPlayground();
setupBatches();
loadModels();
pollViews();
