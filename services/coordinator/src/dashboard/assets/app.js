// imagepipe dashboard: live updates over /v1/events (at most four refreshes a second), the
// buttons' API requests (with the session's CSRF token), uploads and similar-image search.
// Plain JavaScript, no build step. Every DOM text is set with textContent, never as HTML,
// except the server-rendered fragments of /partials/*.
"use strict";

(function () {
  const FLUSH_MS = 250; // at most 4 refreshes per second
  const IDLE_REFRESH_MS = 5000; // the overview's queue figures change without events
  const MAX_ROWS = 50;
  const SIMILAR_RETRY_MS = 2000; // while a task's similar images are not known yet
  const SIMILAR_RETRIES = 30;
  const FILE_LABEL = "file"; // the label naming an uploaded file (describe::FILE_LABEL)

  const csrfMeta = document.querySelector('meta[name="csrf-token"]');
  const csrf = csrfMeta ? csrfMeta.content : null;

  function toast(text, kind) {
    const area = document.querySelector("[data-toasts]");
    if (!area) return;
    const note = document.createElement("div");
    note.className = "toast " + (kind || "ok");
    note.textContent = text;
    area.appendChild(note);
    setTimeout(() => note.remove(), 6000);
  }

  // A request to the API: JSON in and out; an error answer becomes an Error with its message.
  async function api(method, url, body, contentType) {
    const headers = { Accept: "application/json" };
    if (csrf) headers["X-CSRF-Token"] = csrf;
    if (body !== undefined && body !== null) headers["Content-Type"] = contentType || "application/json";
    const response = await fetch(url, { method, headers, body, credentials: "same-origin" });
    const text = await response.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
    if (response.status === 401) {
      window.location.assign("/login?next=" + encodeURIComponent(location.pathname + location.search));
    }
    if (!response.ok) {
      const message = data && data.message ? data.message : response.status + " " + text.slice(0, 200);
      throw new Error(message);
    }
    return data;
  }

  // ---- live updates ------------------------------------------------------------------------

  const live = document.body.dataset.live || "";
  const dirtyTasks = new Set();
  const submitted = new Set();
  let dirty = false;
  let refreshing = false;
  let lastRefresh = Date.now();

  function focusKey() {
    const el = document.activeElement;
    if (!el || el === document.body) return null;
    if (el.id) return "#" + CSS.escape(el.id);
    if (el.dataset && el.dataset.api) return '[data-api="' + CSS.escape(el.dataset.api) + '"]';
    return null;
  }

  function restoreFocus(key) {
    if (!key) return;
    const el = document.querySelector(key);
    if (el) el.focus({ preventScroll: true });
  }

  async function replacePartial() {
    const holder = document.querySelector("[data-partial]");
    if (!holder) return;
    const response = await fetch(holder.dataset.partial, { credentials: "same-origin" });
    if (response.status === 401) { window.location.reload(); return; }
    if (!response.ok) return;
    const html = await response.text();
    const key = focusKey();
    holder.innerHTML = html;
    restoreFocus(key);
  }

  async function refreshRows() {
    const body = document.querySelector("[data-rows]");
    if (!body) return;
    const shown = new Set([...body.querySelectorAll("tr[data-task]")].map((tr) => tr.dataset.task));
    const wanted = [...dirtyTasks].filter((id) => shown.has(id) || (body.dataset.prepend && submitted.has(id)));
    dirtyTasks.clear();
    submitted.clear();
    if (wanted.length === 0) return;
    const response = await fetch("/partials/task-rows?ids=" + wanted.slice(0, MAX_ROWS).map(encodeURIComponent).join(","), { credentials: "same-origin" });
    if (!response.ok) return;
    const template = document.createElement("template");
    template.innerHTML = await response.text();
    const key = focusKey();
    for (const row of [...template.content.querySelectorAll("tr[data-task]")]) {
      const old = document.getElementById(row.id);
      if (old) old.replaceWith(row);
      else body.prepend(row);
    }
    const empty = document.querySelector("[data-empty]");
    if (empty && body.children.length > 0) empty.remove();
    while (body.children.length > MAX_ROWS) body.lastElementChild.remove();
    restoreFocus(key);
  }

  async function flush() {
    const idle = live === "overview" && Date.now() - lastRefresh > IDLE_REFRESH_MS;
    if (refreshing || (!dirty && !idle)) return;
    dirty = false;
    refreshing = true;
    lastRefresh = Date.now();
    try {
      if (live === "rows") await refreshRows();
      else await replacePartial();
      // How many refreshes this page took since it loaded: a script (or a test) that holds an
      // element of a live page knows when it may have been replaced.
      document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
      const similar = document.querySelector("[data-similar]");
      if (similar && similar.dataset.loaded !== "true") loadSimilar(similar);
    } catch (e) {
      console.warn("refresh failed", e);
    } finally {
      refreshing = false;
    }
  }

  function connect() {
    if (!live || !window.EventSource) return;
    const state = document.querySelector("[data-live-state]");
    let url = "/v1/events";
    if (live.startsWith("task:")) url += "?taskId=" + encodeURIComponent(live.slice(5));
    const source = new EventSource(url);
    const types = (document.body.dataset.eventTypes || "").split(",").filter(Boolean);
    // Once an event came with an id, the browser reconnects with Last-Event-ID and the server
    // replays what followed it (or sends `reset`); before that, a connection may have missed
    // events (the first one, those between the page's rendering and its opening): refresh
    // what is shown.
    let resumable = false;
    const onEvent = (event) => {
      dirty = true;
      try {
        const data = JSON.parse(event.data);
        if (data.taskId) {
          dirtyTasks.add(data.taskId);
          if (event.type === "task.submitted") submitted.add(data.taskId);
        }
      } catch (_) { /* lagged and reset: refresh everything */ }
      if (event.lastEventId) resumable = true;
    };
    for (const type of types.concat(["lagged", "reset"])) source.addEventListener(type, onEvent);
    source.onopen = () => {
      if (state) state.textContent = "live";
      if (!resumable) dirty = true;
    };
    source.onerror = () => { if (state) state.textContent = "reconnecting…"; };
    setInterval(flush, FLUSH_MS);
  }

  // ---- buttons -----------------------------------------------------------------------------

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-api]");
    if (!button) return;
    event.preventDefault();
    if (button.dataset.confirm && !window.confirm(button.dataset.confirm)) return;
    button.disabled = true;
    try {
      await api(button.dataset.method || "POST", button.dataset.api);
      toast((button.getAttribute("aria-label") || button.textContent.trim()) + ": done");
      if (button.dataset.remove) {
        const gone = document.getElementById(button.dataset.remove);
        if (gone) gone.remove();
      }
      dirty = true;
      if (!live) window.location.reload();
      else await flush();
    } catch (e) {
      toast(e.message, "error");
    } finally {
      if (button.isConnected) button.disabled = false;
    }
  });

  // ---- uploads -----------------------------------------------------------------------------

  function parseLabels(text) {
    const labels = {};
    for (const pair of text.split(",")) {
      const trimmed = pair.trim();
      if (!trimmed) continue;
      const at = trimmed.indexOf("=");
      if (at <= 0) throw new Error("labels: " + JSON.stringify(trimmed) + " is not key=value");
      labels[trimmed.slice(0, at).trim()] = trimmed.slice(at + 1).trim();
    }
    return labels;
  }

  for (const form of document.querySelectorAll("form[data-upload]")) {
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const output = form.querySelector("[data-upload-result]");
      const file = form.elements.file.files[0];
      if (!file) return;
      const button = form.querySelector("button[type=submit]");
      button.disabled = true;
      output.textContent = "Uploading…";
      try {
        const labels = parseLabels(form.elements.labels.value);
        if (!(FILE_LABEL in labels)) labels[FILE_LABEL] = file.name;
        const blob = await api("POST", "/v1/blobs", file, file.type || "application/octet-stream");
        const accepted = await api("POST", "/v1/tasks", JSON.stringify({ blob: blob.key, labels, priority: form.elements.priority.value }));
        output.textContent = "";
        const link = document.createElement("a");
        link.href = "/tasks/" + encodeURIComponent(accepted.taskId);
        link.textContent = "Task " + accepted.taskId + " " + accepted.state;
        link.dataset.submittedTask = accepted.taskId;
        output.appendChild(link);
        submitted.add(accepted.taskId);
        dirtyTasks.add(accepted.taskId);
        dirty = true;
        form.reset();
      } catch (e) {
        output.textContent = e.message;
        toast(e.message, "error");
      } finally {
        button.disabled = false;
      }
    });
  }

  // ---- similar images ----------------------------------------------------------------------

  // The results of a similar-image search at the holder's data-min-cosine or above (the
  // server's detail::SIMILAR_FLOOR), and how many were below it.
  function renderSimilar(holder, results, emptyText) {
    holder.textContent = "";
    const floor = Number(holder.dataset.minCosine || 0);
    const shown = (results || []).filter((hit) => Number(hit.cosine) >= floor);
    const hidden = (results || []).length - shown.length;
    const note = (text) => {
      const p = document.createElement("p");
      p.textContent = text;
      holder.appendChild(p);
    };
    if (shown.length === 0) note(emptyText);
    const list = document.createElement("ul");
    list.className = "grid";
    for (const hit of shown) {
      const item = document.createElement("li");
      const link = document.createElement("a");
      link.href = "/tasks/" + encodeURIComponent(hit.taskId);
      if (hit.thumbnailKey) {
        const img = document.createElement("img");
        img.src = "/v1/blobs/" + encodeURIComponent(hit.thumbnailKey);
        img.alt = "Task " + hit.taskId;
        img.width = 128;
        img.height = 128;
        img.loading = "lazy";
        link.appendChild(img);
      }
      const caption = document.createElement("span");
      caption.className = "caption";
      caption.textContent = "cosine " + Number(hit.cosine).toFixed(3) + (hit.phashDistance !== undefined ? " · pHash " + hit.phashDistance : "");
      link.appendChild(caption);
      item.appendChild(link);
      list.appendChild(item);
    }
    if (shown.length > 0) holder.appendChild(list);
    if (hidden > 0) {
      note(hidden + (hidden === 1 ? " less similar image" : " less similar images") + " (cosine below " + floor + ") not shown.");
    }
  }

  // A task's similar images, rendered by the server (/partials/tasks/{id}/similar); asked
  // again a little later while the server says they are not known yet.
  let similarTries = 0;
  async function loadSimilar(holder) {
    holder.dataset.loaded = "true";
    similarTries += 1;
    try {
      const response = await fetch("/partials/tasks/" + encodeURIComponent(holder.dataset.similar) + "/similar", { credentials: "same-origin" });
      if (response.status === 401) { window.location.reload(); return; }
      const html = await response.text();
      if (!response.ok) throw new Error(response.status + " " + html.slice(0, 200));
      holder.innerHTML = html;
    } catch (e) {
      holder.textContent = "";
      const p = document.createElement("p");
      p.dataset.similarPending = "";
      p.textContent = "Similar images unavailable: " + e.message;
      holder.appendChild(p);
    }
    if (holder.querySelector("[data-similar-pending]")) {
      holder.dataset.loaded = "false";
      if (similarTries < SIMILAR_RETRIES) setTimeout(() => { if (holder.dataset.loaded !== "true") loadSimilar(holder); }, SIMILAR_RETRY_MS);
    }
  }

  const similar = document.querySelector("[data-similar]");
  if (similar) loadSimilar(similar);

  const dropzone = document.querySelector("[data-similar-upload]");
  if (dropzone) {
    const results = document.querySelector("[data-similar-results]");
    const search = async (file) => {
      if (!file) return;
      results.textContent = "Looking…";
      try {
        const answer = await api("POST", "/v1/search/similar?limit=24", file, file.type || "application/octet-stream");
        renderSimilar(results, answer.results, "No similar image found.");
      } catch (e) {
        results.textContent = e.message;
      }
    };
    dropzone.addEventListener("submit", (event) => event.preventDefault());
    dropzone.elements.file.addEventListener("change", () => search(dropzone.elements.file.files[0]));
    dropzone.addEventListener("dragover", (event) => { event.preventDefault(); dropzone.classList.add("over"); });
    dropzone.addEventListener("dragleave", () => dropzone.classList.remove("over"));
    dropzone.addEventListener("drop", (event) => {
      event.preventDefault();
      dropzone.classList.remove("over");
      search(event.dataTransfer.files[0]);
    });
  }

  // ---- dead letters ------------------------------------------------------------------------

  const replay = document.querySelector("form[data-replay-filter]");
  if (replay) {
    replay.addEventListener("submit", async (event) => {
      event.preventDefault();
      const filter = {};
      if (replay.elements.queue.value) filter.queue = replay.elements.queue.value;
      if (replay.elements.reasonContains.value.trim()) filter.reasonContains = replay.elements.reasonContains.value.trim();
      if (Object.keys(filter).length === 0) {
        if (!window.confirm("No filter: replay every dead letter?")) return;
        filter.all = true;
      }
      try {
        const report = await api("POST", "/v1/dlq/replay", JSON.stringify(filter));
        toast("Replayed " + (report.replayed || 0) + " of " + report.matched + (report.matched === 1 ? " matching letter" : " matching letters"));
        setTimeout(() => window.location.reload(), 800);
      } catch (e) {
        toast(e.message, "error");
      }
    });
  }

  connect();
})();
