// Adapters: upload (.zip/.tar.gz) or register by reference (s3://, file://, hf://), list with their
// facts, grants add/remove, delete.
import { allTenants, api } from "../api.js";
import { act, confirmDialog, field, fmtBytes, fmtTime, h, section, select, showError, showStatus, table } from "../dom.js";

export function render(main) {
  let tenants = [];
  const tenantName = (id) => tenants.find((t) => t.id === id)?.name ?? id;
  const listBox = h("div");

  // ---- upload form
  const nameInput = h("input", { name: "name", required: true, maxlength: 64, autocomplete: "off" });
  const fileInput = h("input", { name: "file", type: "file", required: true, accept: ".zip,.tar.gz,.tgz,application/zip,application/gzip" });
  const visibility = select("visibility", [["private", "private (one tenant, plus grants)"], ["shared", "shared (every tenant)"]], "private");
  const owner = h("select", { name: "tenant_id" });
  const newVersion = h("input", { name: "new_version", type: "checkbox" });
  const uploadBtn = h("button", { type: "submit" }, "Upload adapter");
  const form = h("form", { class: "grid-form", "aria-label": "Upload adapter" },
    field("Adapter name", nameInput, "Tenants put it in the request's model field."),
    field("Adapter archive", fileInput, ".zip or .tar.gz of a PEFT folder: adapter_config.json + adapter_model.safetensors."),
    field("Visibility", visibility),
    field("Owner tenant", owner, "Required for private adapters."),
    h("div", { class: "field checkbox" }, newVersion, h("label", { for: (newVersion.id = "new-version") }, "Upload as a new version of an existing name")),
    h("div", { class: "actions" }, uploadBtn));
  const syncOwner = () => { owner.disabled = visibility.value === "shared"; };
  visibility.addEventListener("change", syncOwner);

  form.addEventListener("submit", (e) => {
    e.preventDefault();
    act(uploadBtn, async () => {
      const data = new FormData();
      data.append("name", nameInput.value.trim());
      data.append("visibility", visibility.value);
      if (visibility.value === "private" && owner.value) data.append("tenant_id", owner.value);
      if (newVersion.checked) data.append("new_version", "true");
      if (fileInput.files.length) data.append("file", fileInput.files[0], fileInput.files[0].name);
      const a = await api.uploadAdapter(data);
      showStatus(`Adapter ${a.name} v${a.version} uploaded (rank ${a.rank}).`);
      form.reset();
      syncOwner();
      await load();
    });
  });

  // ---- register by reference: the files stay in their store and are fetched on first use
  const refName = h("input", { name: "name", required: true, maxlength: 64, autocomplete: "off" });
  const refSource = h("input", { name: "source", required: true, maxlength: 1024, autocomplete: "off", placeholder: "s3://bucket/prefix/" });
  const refVisibility = select("visibility", [["private", "private (one tenant, plus grants)"], ["shared", "shared (every tenant)"]], "private");
  const refOwner = h("select", { name: "tenant_id" });
  const refNewVersion = h("input", { name: "new_version", type: "checkbox" });
  const refBtn = h("button", { type: "submit" }, "Register adapter");
  const refForm = h("form", { class: "grid-form", "aria-label": "Register adapter by reference" },
    field("Adapter name", refName, "Tenants put it in the request's model field."),
    field("Source URI", refSource, "s3://bucket/prefix/, file:///abs/path or hf://org/repo[@revision]: a folder with adapter_config.json + adapter_model.safetensors."),
    field("Visibility", refVisibility),
    field("Owner tenant", refOwner, "Required for private adapters."),
    h("div", { class: "field checkbox" }, refNewVersion, h("label", { for: (refNewVersion.id = "ref-new-version") }, "Register as a new version of an existing name")),
    h("div", { class: "actions" }, refBtn));
  const syncRefOwner = () => { refOwner.disabled = refVisibility.value === "shared"; };
  refVisibility.addEventListener("change", syncRefOwner);
  refForm.addEventListener("submit", (e) => {
    e.preventDefault();
    act(refBtn, async () => {
      const body = { name: refName.value.trim(), source: refSource.value.trim(), visibility: refVisibility.value, new_version: refNewVersion.checked };
      if (refVisibility.value === "private" && refOwner.value) body.tenant_id = refOwner.value;
      const a = await api.registerAdapter(body);
      showStatus(`Adapter ${a.name} v${a.version} registered from ${a.source_uri} (rank ${a.rank}).`);
      refForm.reset();
      syncRefOwner();
      await load();
    });
  });

  const showOld = h("input", { type: "checkbox", id: "show-superseded", onchange: () => load() });

  async function removeGrant(a, tenantId) {
    await act(null, async () => {
      await api.removeGrant(a.id, tenantId);
      showStatus(`${tenantName(tenantId)} may no longer use ${a.name}.`);
      await load();
    });
  }

  function grantsCell(a) {
    if (a.visibility !== "private") return h("span", { class: "muted" }, "all tenants");
    const items = a.granted_tenant_ids.map((tid) => h("li", {}, tenantName(tid), " ",
      h("button", { type: "button", class: "small", "aria-label": `Remove grant for ${tenantName(tid)} on ${a.name} v${a.version}`, onclick: () => removeGrant(a, tid) }, "Remove")));
    const choices = tenants.filter((t) => t.id !== a.owner_tenant_id && !a.granted_tenant_ids.includes(t.id));
    const pick = h("select", { "aria-label": `Tenant to grant ${a.name} v${a.version}` },
      h("option", { value: "" }, "choose tenant…"), choices.map((t) => h("option", { value: t.id }, t.name)));
    const add = h("button", { type: "button", class: "small", "aria-label": `Add grant on ${a.name} v${a.version}` }, "Grant");
    add.addEventListener("click", () => act(add, async () => {
      if (!pick.value) throw new Error("Choose a tenant to grant the adapter to.");
      await api.addGrant(a.id, pick.value);
      showStatus(`${tenantName(pick.value)} may now use ${a.name}.`);
      await load();
    }));
    return h("div", { class: "grants" }, items.length ? h("ul", {}, items) : h("span", { class: "muted" }, "none"), h("div", { class: "inline" }, pick, add));
  }

  async function remove(a) {
    if (!(await confirmDialog(`Delete adapter ${a.name} version ${a.version}? The engine drops it at once.`, "Delete adapter"))) return;
    await act(null, async () => {
      await api.deleteAdapter(a.id);
      showStatus(`Adapter ${a.name} v${a.version} deleted.`);
      await load();
    });
  }

  async function load() {
    try {
      const [ts, list] = await Promise.all([allTenants(), api.listAdapters({ include_superseded: showOld.checked || undefined })]);
      tenants = ts;
      const current = owner.value;
      owner.replaceChildren(h("option", { value: "" }, "(none)"), ...tenants.map((t) => h("option", { value: t.id }, t.name)));
      refOwner.replaceChildren(h("option", { value: "" }, "(none)"), ...tenants.map((t) => h("option", { value: t.id }, t.name)));
      owner.value = tenants.some((t) => t.id === current) ? current : "";
      listBox.replaceChildren(table(`Adapters (${list.data.length})`, [
        { label: "Name", cell: (a) => h("strong", {}, a.name) },
        { label: "Version", cell: (a) => String(a.version), class: "num" },
        { label: "Visibility", cell: (a) => a.visibility },
        { label: "Owner", cell: (a) => (a.owner_tenant_id ? tenantName(a.owner_tenant_id) : "—") },
        { label: "Rank", cell: (a) => String(a.rank), class: "num" },
        { label: "Alpha", cell: (a) => `${a.alpha}${a.use_rslora ? " (rsLoRA)" : ""}`, class: "num" },
        { label: "Targets", cell: (a) => a.target_modules.join(", ") },
        { label: "SHA-256", cell: (a) => h("code", { class: "hash", title: a.sha256 }, a.sha256) },
        { label: "Size", cell: (a) => fmtBytes(a.size_bytes), class: "num" },
        { label: "Status", cell: (a) => h("span", {},
          h("span", { class: `badge ${a.status}`, title: a.status_reason || "" }, a.status),
          a.status_reason ? h("small", { class: "reason" }, ` ${a.status_reason}`) : "") },
        { label: "Uploaded", cell: (a) => fmtTime(a.created_at) },
        { label: "Source", cell: (a) => (a.source_uri ? h("code", {}, a.source_uri) : h("span", { class: "muted" }, "upload")) },
        { label: "Grants", cell: grantsCell },
        { label: "Actions", cell: (a) => h("button", { type: "button", class: "danger", "aria-label": `Delete adapter ${a.name} v${a.version}`, onclick: () => remove(a) }, "Delete") },
      ], list.data, "No adapters yet."));
    } catch (err) {
      showError(err);
    }
  }

  main.append(
    h("h1", {}, "Adapters"),
    section("Upload a PEFT adapter", form),
    section("Register an adapter by reference", refForm),
    section("All adapters", h("div", { class: "field checkbox" }, showOld, h("label", { for: "show-superseded" }, "Show superseded versions")), listBox),
  );
  syncOwner();
  syncRefOwner();
  load();
}
