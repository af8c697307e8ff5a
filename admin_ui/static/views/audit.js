// Audit log: who changed what, most recent first.
import { api } from "../api.js";
import { act, field, fmtTime, h, section, showError, table } from "../dom.js";

function changes(entry) {
  if (!entry.before && !entry.after) return "—";
  const fmt = (v) => (v ? JSON.stringify(v, null, 1) : "—");
  return h("details", {}, h("summary", {}, "changes"),
    h("div", { class: "diff" },
      h("div", {}, h("strong", {}, "before"), h("pre", {}, fmt(entry.before))),
      h("div", {}, h("strong", {}, "after"), h("pre", {}, fmt(entry.after)))));
}

export function render(main) {
  const action = h("input", { name: "action", autocomplete: "off", placeholder: "e.g. tenant.create" });
  const target = h("input", { name: "target_id", autocomplete: "off" });
  const limit = h("input", { name: "limit", type: "number", min: 1, max: 1000, value: 100 });
  const btn = h("button", { type: "submit" }, "Show entries");
  const form = h("form", { class: "grid-form", "aria-label": "Audit filter" },
    field("Action", action), field("Target ID", target), field("Entries", limit), h("div", { class: "actions" }, btn));
  const out = h("div");

  async function load() {
    const list = await api.audit({ action: action.value.trim(), target_id: target.value.trim(), limit: limit.value });
    out.replaceChildren(table(`Audit log (${list.data.length} entries)`, [
      { label: "Time", cell: (e) => fmtTime(e.created_at) },
      { label: "Actor", cell: (e) => e.actor },
      { label: "Action", cell: (e) => h("code", {}, e.action) },
      { label: "Target", cell: (e) => e.target_type },
      { label: "Target ID", cell: (e) => h("code", {}, e.target_id) },
      { label: "Changes", cell: changes },
    ], list.data, "No audit entries match."));
  }
  form.addEventListener("submit", (e) => { e.preventDefault(); act(btn, load); });
  main.append(h("h1", {}, "Audit log"), section("Filter", form), section("Entries", out));
  load().catch(showError);
}
