// A tenant's projects (under the tenant's page): create, list, edit (limits, models, priority,
// weight), archive; and the project picker of the tenant's key form.
import { api } from "../api.js";
import { act, confirmDialog, field, fmtTime, h, section, select, showError, showStatus, table } from "../dom.js";

const LIMITS = ["rpm", "tpm", "max_concurrent"];

function projectFields(p = {}, prefix = "") {
  const limit = (name) => h("input", { name: prefix + name, type: "number", min: 1, step: 1, placeholder: "tenant's only", value: p[name] ?? "" });
  const inputs = {
    name: h("input", { name: prefix + "name", required: true, maxlength: 64, autocomplete: "off", value: p.name ?? "" }),
    rpm: limit("rpm"),
    tpm: limit("tpm"),
    max_concurrent: limit("max_concurrent"),
    models: h("input", { name: prefix + "models", autocomplete: "off", placeholder: "all of the tenant's", value: (p.models ?? []).join(", ") }),
    priority: h("input", { name: prefix + "priority", type: "number", min: 0, max: 9, step: 1, required: true, value: p.priority ?? 0 }),
    weight: h("input", { name: prefix + "weight", type: "number", min: 0, step: "any", required: true, value: p.weight ?? 1 }),
  };
  const fields = [
    field("Project name", inputs.name, "Unique within the tenant."),
    field("Project requests per minute", inputs.rpm),
    field("Project tokens per minute", inputs.tpm),
    field("Project max concurrent requests", inputs.max_concurrent),
    field("Project models", inputs.models, "Comma-separated; empty = every model the tenant may use."),
    field("Project priority", inputs.priority, "0–9 inside the tenant; lower runs first."),
    field("Project weight", inputs.weight, "Its part of the tenant's fair share."),
  ];
  const values = () => {
    const body = { name: inputs.name.value.trim(), priority: Number(inputs.priority.value), weight: Number(inputs.weight.value) };
    for (const k of LIMITS) {
      const v = inputs[k].value.trim();
      body[k] = v === "" ? null : Number(v);
    }
    const models = inputs.models.value.split(",").map((m) => m.trim()).filter(Boolean);
    body.models = models.length ? models : null;
    return body;
  };
  return { fields, values };
}

export function projectsSection(t, onChanged = () => {}) {
  const listBox = h("div", { "aria-live": "polite" });
  const editBox = h("div");
  const create = projectFields();
  const createBtn = h("button", { type: "submit" }, "Create project");
  const form = h("form", { class: "grid-form", "aria-label": "Create project" }, create.fields, h("div", { class: "actions" }, createBtn));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    act(createBtn, async () => {
      const p = await api.createProject(t.id, create.values());
      showStatus(`Project ${p.name} created.`);
      form.reset();
      await load();
    });
  });

  function edit(p) {
    const fields = projectFields(p, "edit_");
    const save = h("button", { type: "submit" }, "Save project");
    const cancel = h("button", { type: "button", onclick: () => editBox.replaceChildren() }, "Cancel");
    const f = h("form", { class: "grid-form", "aria-label": `Edit project ${p.name}` }, fields.fields, h("div", { class: "actions" }, save, cancel));
    f.addEventListener("submit", (e) => {
      e.preventDefault();
      act(save, async () => {
        const updated = await api.updateProject(p.id, fields.values());
        showStatus(`Project ${updated.name} saved.`);
        editBox.replaceChildren();
        await load();
      });
    });
    editBox.replaceChildren(f);
  }

  async function archive(p) {
    if (!(await confirmDialog(`Archive project "${p.name}"? Its keys stop working; its usage history stays.`, "Archive project"))) return;
    await act(null, async () => {
      await api.archiveProject(p.id);
      showStatus(`Project ${p.name} archived.`);
      await load();
    });
  }

  async function load() {
    try {
      const projects = (await api.listProjects(t.id)).data;
      const limit = (v) => (v == null ? "—" : String(v));
      listBox.replaceChildren(table("Projects", [
        { label: "Name", cell: (p) => p.name },
        { label: "RPM", cell: (p) => limit(p.rpm), class: "num" },
        { label: "TPM", cell: (p) => limit(p.tpm), class: "num" },
        { label: "Concurrent", cell: (p) => limit(p.max_concurrent), class: "num" },
        { label: "Models", cell: (p) => (p.models ? p.models.join(", ") : "all") },
        { label: "Priority", cell: (p) => String(p.priority), class: "num" },
        { label: "Weight", cell: (p) => String(p.weight), class: "num" },
        { label: "Created", cell: (p) => fmtTime(p.created_at) },
        { label: "ID", cell: (p) => h("code", {}, p.id) },
        { label: "Actions", cell: (p) => h("div", { class: "row-actions" },
          h("button", { type: "button", "aria-label": `Edit project ${p.name}`, onclick: () => edit(p) }, "Edit"),
          h("button", { type: "button", class: "danger", "aria-label": `Archive project ${p.name}`, onclick: () => archive(p) }, "Archive"),
        ) },
      ], projects, "No projects yet: keys draw on the tenant's limits and share only."));
      onChanged(projects);
    } catch (err) {
      showError(err);
    }
  }
  load();
  return section("Projects", form, editBox, listBox);
}

/** The key form's project choice: "(none)" or one of the tenant's active projects. */
export function projectPicker() {
  const control = select("project_id", [["", "(no project)"]], "");
  const refresh = (projects) => {
    const current = control.value;
    control.replaceChildren(h("option", { value: "" }, "(no project)"), ...projects.map((p) => h("option", { value: p.id }, p.name)));
    control.value = projects.some((p) => p.id === current) ? current : "";
  };
  return { field: field("Project", control, "Its limits, models and share apply to the key."), value: () => control.value || null, refresh };
}
