// Tenants: create, list (paged), open, delete with confirmation.
import { api } from "../api.js";
import { act, confirmDialog, field, fmtTime, h, section, select, showError, showStatus, table } from "../dom.js";

const PAGE = 50;

export function tenantFields(t = {}) {
  const inputs = {
    name: h("input", { name: "name", required: true, maxlength: 64, autocomplete: "off", value: t.name ?? "" }),
    priority: h("input", { name: "priority", type: "number", min: 0, max: 9, step: 1, required: true, value: t.priority ?? 0 }),
    weight: h("input", { name: "weight", type: "number", min: 0, step: "any", required: true, value: t.weight ?? 1 }),
    status: select("status", [["active", "active"], ["suspended", "suspended"]], t.status ?? "active"),
  };
  const fields = [
    field("Name", inputs.name, "Letters, digits, '.', '_' and '-'."),
    field("Priority class", inputs.priority, "0–9; lower classes run first."),
    field("Weight", inputs.weight, "Fair share within a class."),
    field("Status", inputs.status),
  ];
  const values = () => ({
    name: inputs.name.value.trim(),
    priority: Number(inputs.priority.value),
    weight: Number(inputs.weight.value),
    status: inputs.status.value,
  });
  return { inputs, fields, values };
}

export async function deleteTenant(t, after) {
  const ok = await confirmDialog(`Delete tenant "${t.name}" with its keys, quota, grants, usage and private adapters? This cannot be undone.`, "Delete tenant");
  if (!ok) return;
  await act(null, async () => {
    await api.deleteTenant(t.id);
    showStatus(`Tenant ${t.name} deleted.`);
    after();
  });
}

export function render(main) {
  let offset = 0;
  const listBox = h("div", { "aria-live": "polite" });
  const create = tenantFields();
  const createBtn = h("button", { type: "submit" }, "Create tenant");
  const form = h("form", { class: "grid-form", "aria-label": "Create tenant" }, create.fields, h("div", { class: "actions" }, createBtn));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    act(createBtn, async () => {
      const t = await api.createTenant(create.values());
      showStatus(`Tenant ${t.name} created.`);
      form.reset();
      await load();
    });
  });

  async function load() {
    try {
      const page = await api.listTenants({ limit: PAGE, offset });
      const cols = [
        { label: "Name", cell: (t) => h("a", { href: `#/tenants/${encodeURIComponent(t.id)}` }, t.name) },
        { label: "Priority", cell: (t) => String(t.priority), class: "num" },
        { label: "Weight", cell: (t) => String(t.weight), class: "num" },
        { label: "Status", cell: (t) => h("span", { class: `badge ${t.status}` }, t.status) },
        { label: "Created", cell: (t) => fmtTime(t.created_at) },
        { label: "ID", cell: (t) => h("code", {}, t.id) },
        { label: "Actions", cell: (t) => h("div", { class: "row-actions" },
          h("a", { class: "button", href: `#/tenants/${encodeURIComponent(t.id)}`, "aria-label": `Edit tenant ${t.name}` }, "Edit"),
          h("button", { type: "button", class: "danger", "aria-label": `Delete tenant ${t.name}`, onclick: () => deleteTenant(t, load) }, "Delete"),
        ) },
      ];
      const pager = page.total > PAGE ? h("div", { class: "pager" },
        h("button", { type: "button", disabled: offset === 0, onclick: () => { offset = Math.max(0, offset - PAGE); load(); } }, "Previous page"),
        h("span", {}, `${offset + 1}–${Math.min(offset + PAGE, page.total)} of ${page.total}`),
        h("button", { type: "button", disabled: offset + PAGE >= page.total, onclick: () => { offset += PAGE; load(); } }, "Next page"),
      ) : null;
      listBox.replaceChildren(table(`Tenants (${page.total})`, cols, page.data, "No tenants yet."), pager ?? "");
    } catch (err) {
      showError(err);
    }
  }

  main.append(
    h("h1", {}, "Tenants"),
    section("New tenant", form),
    section("All tenants", listBox),
  );
  load();
}
