// One tenant: settings (edit/delete), projects (views/projects.js), API keys (create → shown once, revoke), quota, usable adapters.
import { api } from "../api.js";
import { act, confirmDialog, field, fmtTime, h, localToIso, section, select, showError, showStatus, table } from "../dom.js";
import { deleteTenant, tenantFields } from "./tenants.js";
import { meter } from "../charts.js";
import { budgetSection } from "./budget.js";
import { projectPicker, projectsSection } from "./projects.js";

export function render(main, { match, navigate }) {
  const [tenantId] = match;
  let alive = true;
  main.append(h("p", { class: "muted" }, "Loading tenant…"));

  (async () => {
    let t;
    try {
      t = await api.getTenant(tenantId);
    } catch (err) {
      main.replaceChildren(h("h1", {}, "Tenant"), h("p", {}, h("a", { href: "#/tenants" }, "Back to tenants")));
      showError(err);
      return;
    }
    if (!alive) return;
    const title = h("h1", {}, `Tenant ${t.name}`);
    main.replaceChildren(
      h("p", { class: "crumbs" }, h("a", { href: "#/tenants" }, "Tenants"), " / ", t.name),
      title,
      h("p", { class: "muted" }, "ID ", h("code", {}, t.id), " · created ", fmtTime(t.created_at)),
      settingsSection(t, (updated) => { t = updated; title.textContent = `Tenant ${t.name}`; }, () => navigate("#/tenants")),
      ...keysAndProjects(t),
      quotaSection(t),
      consumptionSection(t),
      budgetSection(t),
      adaptersSection(t),
      h("p", {}, h("a", { href: `#/usage?tenant_id=${encodeURIComponent(t.id)}` }, `Usage of ${t.name}`)),
    );
  })();
  return () => { alive = false; };
}

function settingsSection(t, onSaved, onDeleted) {
  const edit = tenantFields(t);
  const save = h("button", { type: "submit" }, "Save tenant");
  const del = h("button", { type: "button", class: "danger", onclick: () => deleteTenant(t, onDeleted) }, "Delete tenant");
  const form = h("form", { class: "grid-form", "aria-label": "Tenant settings" }, edit.fields, h("div", { class: "actions" }, save, del));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    act(save, async () => {
      const updated = await api.updateTenant(t.id, edit.values());
      Object.assign(t, updated);
      onSaved(updated);
      showStatus(`Tenant ${updated.name} saved.`);
    });
  });
  return section("Settings", form);
}

function keyState(k) {
  if (k.revoked_at) return "revoked";
  if (k.expires_at && new Date(/[zZ]|[+-]\d\d:?\d\d$/.test(k.expires_at) ? k.expires_at : `${k.expires_at}Z`) <= new Date()) return "expired";
  return "active";
}

function keysAndProjects(t) {
  const picker = projectPicker();
  return [projectsSection(t, picker.refresh), keysSection(t, picker)];
}

function keysSection(t, picker) {
  const listBox = h("div");
  const reveal = h("div", { class: "reveal-box" });
  const nameInput = h("input", { name: "key_name", maxlength: 64, autocomplete: "off" });
  const expiresInput = h("input", { name: "expires_at", type: "datetime-local" });
  const createBtn = h("button", { type: "submit" }, "Create key");
  const form = h("form", { class: "grid-form", "aria-label": "Create API key" },
    field("Key name", nameInput, "Optional, to tell keys apart."),
    field("Expires at", expiresInput, "Optional; empty = never (your local time)."),
    picker.field,
    h("div", { class: "actions" }, createBtn));

  form.addEventListener("submit", (e) => {
    e.preventDefault();
    act(createBtn, async () => {
      const body = { name: nameInput.value.trim() };
      const expires = localToIso(expiresInput.value);
      if (expires) body.expires_at = expires;
      if (picker.value()) body.project_id = picker.value();
      const created = await api.createKey(t.id, body);
      form.reset();
      showKeyOnce(created);
      await load();
    });
  });

  function showKeyOnce(created) {
    const keyField = h("input", { readOnly: true, class: "mono", value: created.key, size: Math.min(created.key.length + 2, 80) });
    const copyBtn = h("button", { type: "button" }, "Copy key");
    copyBtn.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(created.key);
        showStatus("Key copied to the clipboard.");
      } catch {
        keyField.select(); // no clipboard permission (plain http): select it for Ctrl+C instead
        showStatus("Copying is blocked here; the key is selected, press Ctrl+C.");
      }
    });
    const box = h("div", { class: "notice success", role: "region", "aria-label": "New API key" },
      h("p", {}, h("strong", {}, "This is the only time the full key is shown. Store it now.")),
      field(`New API key${created.name ? ` (${created.name})` : ""}`, keyField),
      h("div", { class: "actions" }, copyBtn,
        h("button", { type: "button", onclick: () => reveal.replaceChildren() }, "I have stored the key")));
    reveal.replaceChildren(box);
    keyField.focus();
    keyField.select();
  }

  async function revoke(k) {
    const label = k.name || k.prefix;
    if (!(await confirmDialog(`Revoke key "${label}"? Requests with it fail from now on.`, "Revoke key"))) return;
    await act(null, async () => {
      await api.revokeKey(k.id);
      showStatus(`Key ${label} revoked.`);
      await load();
    });
  }

  async function load() {
    try {
      const keys = (await api.listKeys(t.id)).data;
      listBox.replaceChildren(table("API keys", [
        { label: "Name", cell: (k) => k.name || "—" },
        { label: "Prefix", cell: (k) => h("code", {}, `${k.prefix}…`) },
        { label: "Project", cell: (k) => (k.project_id ? h("code", {}, k.project_id) : "—") },
        { label: "Created", cell: (k) => fmtTime(k.created_at) },
        { label: "Expires", cell: (k) => (k.expires_at ? fmtTime(k.expires_at) : "never") },
        { label: "Last used", cell: (k) => (k.last_used_at ? fmtTime(k.last_used_at) : "never") },
        { label: "Status", cell: (k) => h("span", { class: `badge ${keyState(k)}` }, keyState(k)) },
        { label: "Actions", cell: (k) => (k.revoked_at ? "" : h("button", {
          type: "button", class: "danger", "aria-label": `Revoke key ${k.name || k.prefix}`, onclick: () => revoke(k),
        }, "Revoke")) },
      ], keys, "No API keys yet."));
    } catch (err) {
      showError(err);
    }
  }
  load();
  return section("API keys", form, reveal, listBox);
}

function quotaSection(t) {
  const limit = (name) => h("input", { name, type: "number", min: 1, step: 1, placeholder: "unlimited" });
  const inputs = {
    rpm: limit("rpm"),
    tpm: limit("tpm"),
    max_concurrent: limit("max_concurrent"),
    token_budget: limit("token_budget"),
    budget_period: select("budget_period", [["month", "month"], ["day", "day"]], "month"),
  };
  const save = h("button", { type: "submit" }, "Save quota");
  // Disabled until the current quota is loaded, so a slow answer never overwrites what was typed.
  const fieldset = h("fieldset", { class: "grid-form plain", disabled: true },
    h("legend", { class: "visually-hidden" }, "Limits"),
    field("Requests per minute", inputs.rpm),
    field("Tokens per minute", inputs.tpm),
    field("Max concurrent requests", inputs.max_concurrent),
    field("Token budget", inputs.token_budget),
    field("Budget period", inputs.budget_period),
    h("p", { class: "hint wide" }, "Leave a field empty for no limit."),
    h("div", { class: "actions" }, save));
  const form = h("form", { "aria-label": "Quota" }, fieldset);

  const fill = (q) => {
    for (const k of ["rpm", "tpm", "max_concurrent", "token_budget"]) inputs[k].value = q[k] ?? "";
    inputs.budget_period.value = q.budget_period || "month";
  };
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    act(save, async () => {
      const body = { budget_period: inputs.budget_period.value };
      for (const k of ["rpm", "tpm", "max_concurrent", "token_budget"]) {
        const v = inputs[k].value.trim();
        body[k] = v === "" ? null : Number(v);
      }
      fill(await api.putQuota(t.id, body));
      showStatus(`Quota of ${t.name} saved.`);
    });
  });
  api.getQuota(t.id).then((q) => { fill(q); fieldset.disabled = false; }, showError);
  return section("Quota", form);
}

function consumptionSection(t) {
  const box = h("div", { "aria-live": "polite" }, h("p", { class: "muted" }, "Loading…"));
  const load = () => api.quotaConsumption(t.id).then((c) => {
    box.replaceChildren(
      meter("Requests in the last minute", c.requests_last_minute, c.rpm),
      meter("Tokens in the last minute", c.tokens_last_minute, c.tpm),
      meter("Requests running now", c.running, c.max_concurrent),
      meter(`Token budget used this ${c.budget_period}`, c.budget_used, c.token_budget),
      h("p", { class: "hint" }, `Budget period started ${fmtTime(c.period_start)}.`));
  }, (err) => { box.replaceChildren(); showError(err); });
  load();
  const again = h("button", { type: "button", onclick: () => act(again, load) }, "Refresh consumption");
  return section("Quota consumption now", box, h("div", { class: "actions" }, again));
}

function adaptersSection(t) {
  const box = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  api.listAdapters({ tenant_id: t.id }).then((list) => {
    box.replaceChildren(table(`Adapters ${t.name} may use`, [
      { label: "Name", cell: (a) => a.name },
      { label: "Version", cell: (a) => String(a.version), class: "num" },
      { label: "Visibility", cell: (a) => (a.visibility === "private" && a.owner_tenant_id !== t.id ? "granted" : a.visibility) },
      { label: "Rank", cell: (a) => String(a.rank), class: "num" },
      { label: "Status", cell: (a) => a.status },
    ], list.data, "No adapters: this tenant can use the base model only."));
  }, (err) => { box.replaceChildren(); showError(err); });
  return section("Adapters", box, h("p", {}, h("a", { href: "#/adapters" }, "Manage adapters")));
}
