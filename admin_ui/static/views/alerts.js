// Alerts: the registered webhooks (never their secrets: the API does not return them) and the
// newest events with each delivery's state, attempts and last error (docs/alerts.md). Read-only:
// webhooks are registered through the admin API, where the URL check (SSRF) and the caps answer.
import { api } from "../api.js";
import { act, field, fmtTime, h, section, select, showError, table } from "../dom.js";

function deliveries(event) {
  if (!event.deliveries.length) return event.state === "pending" ? "not fanned out yet" : "no matching webhook";
  return h("ul", { class: "plain" }, event.deliveries.map((d) =>
    h("li", { dataset: { state: d.state } },
      h("code", {}, d.webhook_id), " ", h("strong", {}, d.state),
      ` · ${d.attempts} attempt(s)`,
      d.last_status ? ` · HTTP ${d.last_status}` : "",
      d.last_error ? h("span", { class: "hint" }, ` · ${d.last_error}`) : "",
      d.delivered_at ? ` · ${fmtTime(d.delivered_at)}` : "")));
}

function subject(event) {
  const d = event.data || {};
  const who = d.scope === "key" ? `key ${d.key_id}` : `tenant ${d.tenant_id}`;
  const pct = d.threshold_percent === null || d.threshold_percent === undefined ? "" : ` ${d.threshold_percent} %`;
  return `${who} · ${d.rule}${pct} · ${d.used} / ${d.limit} ${d.unit}`;
}

export function render(main) {
  const hooksOut = h("div");
  const type = select("type", [["", "every kind"], ["limit.threshold", "limit.threshold"], ["limit.refused", "limit.refused"]], "");
  const tenant = h("input", { name: "tenant_id", autocomplete: "off" });
  const limit = h("input", { name: "limit", type: "number", min: 1, max: 1000, value: 50 });
  const btn = h("button", { type: "submit" }, "Show events");
  const form = h("form", { class: "grid-form", "aria-label": "Alert events filter" },
    field("Kind", type), field("Tenant ID", tenant), field("Events", limit), h("div", { class: "actions" }, btn));
  const eventsOut = h("div");

  async function loadHooks() {
    const list = await api.webhooks();
    hooksOut.replaceChildren(table(`Webhooks (${list.data.length})`, [
      { label: "ID", cell: (w) => h("code", {}, w.id) },
      { label: "URL", cell: (w) => h("code", {}, w.url) },
      { label: "Kinds", cell: (w) => (w.events.length ? w.events.join(", ") : "every kind") },
      { label: "Tenant", cell: (w) => (w.tenant_id ? h("code", {}, w.tenant_id) : "every tenant") },
      { label: "Created", cell: (w) => fmtTime(w.created_at) },
    ], list.data, "No webhooks registered (POST /admin/v1/webhooks)."));
  }

  async function loadEvents() {
    const list = await api.alertEvents({ type: type.value, tenant_id: tenant.value.trim(), limit: limit.value });
    eventsOut.replaceChildren(table(`Recent alert events (${list.data.length})`, [
      { label: "Time", cell: (e) => fmtTime(e.created_at) },
      { label: "Kind", cell: (e) => h("code", {}, e.type) },
      { label: "Subject", cell: subject },
      { label: "Event ID", cell: (e) => h("code", {}, e.id) },
      { label: "Deliveries", cell: deliveries },
    ], list.data, "No alert events match."));
  }

  form.addEventListener("submit", (e) => { e.preventDefault(); act(btn, loadEvents); });
  main.append(h("h1", {}, "Alerts"), section("Webhooks", hooksOut), section("Filter", form), section("Events", eventsOut));
  loadHooks().catch(showError);
  loadEvents().catch(showError);
}
