// Small DOM helpers. Data from the server is only ever set as text (never parsed as HTML).

/** h("button", {type: "button", onclick}, "Save") — attributes, `on*` listeners, children. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  // The server validates every field and its message is shown verbatim; the browser's own checks
  // would stop a request silently (its tooltip is easy to miss and invisible to tests).
  if (tag === "form") el.noValidate = true;
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else if (name === "class") {
      el.className = value;
    } else if (name === "dataset") {
      Object.assign(el.dataset, value);
    } else if (name === "value" && tag !== "input") {
      el.value = value; // (an input's value attribute is its default, so form.reset() restores it)
    } else if (name === "readOnly") {
      el.readOnly = Boolean(value);
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

let idCounter = 0;
export const uid = (stem) => `${stem}-${++idCounter}`;

/** A labelled form field: <div><label for=id>text</label><input id=id ...></div>. */
export function field(labelText, control, hint) {
  if (!control.id) control.id = uid("f");
  const parts = [h("label", { for: control.id }, labelText), control];
  if (hint) {
    const hintId = uid("hint");
    control.setAttribute("aria-describedby", hintId);
    parts.push(h("small", { id: hintId, class: "hint" }, hint));
  }
  return h("div", { class: "field" }, parts);
}

export function select(name, options, value) {
  return h("select", { name }, options.map(([v, text]) => h("option", { value: v, selected: String(v) === String(value ?? "") }, text)));
}

// ---- notices: one error region (role=alert) and one status region for the whole page ----------

export function showError(err) {
  const box = document.getElementById("error");
  const text = document.getElementById("error-text");
  const meta = document.getElementById("error-meta");
  text.textContent = err && err.message ? err.message : String(err);
  const bits = [];
  if (err && err.status) bits.push(`HTTP ${err.status}`);
  if (err && err.type) bits.push(err.type);
  if (err && err.code) bits.push(err.code);
  if (err && err.param) bits.push(`field: ${err.param}`);
  meta.textContent = bits.join(" · ");
  box.hidden = false;
  if (!(err && err.name === "ApiError")) console.error(err);
}

export function clearError() {
  document.getElementById("error").hidden = true;
  document.getElementById("error-text").textContent = "";
  document.getElementById("error-meta").textContent = "";
}

let statusTimer = null;
export function showStatus(message) {
  const el = document.getElementById("status");
  el.textContent = message;
  clearTimeout(statusTimer);
  statusTimer = setTimeout(() => { el.textContent = ""; }, 6000);
}

/** Run a user action: clear the old error, disable the trigger while it runs, report failures. */
export async function act(trigger, fn) {
  clearError();
  if (trigger) trigger.disabled = true;
  try {
    return await fn();
  } catch (err) {
    showError(err);
    return undefined;
  } finally {
    if (trigger) trigger.disabled = false;
  }
}

// ---- confirmation dialog ------------------------------------------------------------------------

export function confirmDialog(message, confirmLabel = "Confirm") {
  return new Promise((resolve) => {
    const titleId = uid("dlg");
    const dialog = h("dialog", { class: "confirm", "aria-labelledby": titleId },
      h("h2", { id: titleId }, "Please confirm"),
      h("p", {}, message),
    );
    const done = (answer) => {
      dialog.close();
      dialog.remove();
      resolve(answer);
    };
    const ok = h("button", { type: "button", class: "danger", onclick: () => done(true) }, confirmLabel);
    const cancel = h("button", { type: "button", onclick: () => done(false) }, "Cancel");
    dialog.append(h("div", { class: "actions" }, cancel, ok));
    dialog.addEventListener("cancel", (e) => { e.preventDefault(); done(false); });
    document.body.append(dialog);
    dialog.showModal();
    cancel.focus();
  });
}

// ---- tables and formatting --------------------------------------------------------------------

/** columns: [{label, cell(row) -> Node|string, class?}] */
export function table(caption, columns, rows, emptyText = "Nothing here yet.") {
  if (!rows.length) return h("p", { class: "empty" }, emptyText);
  return h("table", {},
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col", class: c.class }, c.label)))),
    h("tbody", {}, rows.map((row) => h("tr", {}, columns.map((c) => h("td", { class: c.class }, c.cell(row)))))),
  );
}

export function fmtTime(value) {
  if (!value) return "—";
  // The API sends naive UTC timestamps from SQLite; treat a missing offset as UTC.
  const s = /[zZ]|[+-]\d\d:?\d\d$/.test(value) ? value : `${value}Z`;
  const d = new Date(s);
  return Number.isNaN(d.getTime()) ? value : d.toLocaleString();
}

export function fmtNumber(n) {
  return n === null || n === undefined ? "—" : Number(n).toLocaleString();
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB"];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

/** datetime-local value -> ISO string with a time zone (the API wants aware datetimes). */
export function localToIso(value) {
  if (!value) return null;
  const d = new Date(value);
  return Number.isNaN(d.getTime()) ? value : d.toISOString();
}

export function section(title, ...children) {
  const id = uid("sec");
  return h("section", { class: "card", "aria-labelledby": id }, h("h2", { id }, title), children);
}
