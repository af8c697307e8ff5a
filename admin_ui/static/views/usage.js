// Usage: requests, errors and tokens per hour, day or adapter, for one tenant or all.
import { allTenants, api } from "../api.js";
import { act, field, fmtNumber, h, localToIso, section, select, showError, table } from "../dom.js";

export function render(main, { query }) {
  const tenant = h("select", { name: "tenant_id" }, h("option", { value: "" }, "All tenants"));
  const groupBy = select("group_by", [["day", "day"], ["hour", "hour"], ["adapter", "adapter"]], query.get("group_by") || "day");
  const since = h("input", { name: "since", type: "datetime-local" });
  const until = h("input", { name: "until", type: "datetime-local" });
  const showBtn = h("button", { type: "submit" }, "Show usage");
  const exportBtns = ["csv", "jsonl"].map((format) => {
    const btn = h("button", { type: "button" }, `Export ${format.toUpperCase()}`);
    btn.addEventListener("click", () => act(btn, () => exportRecords(format)));
    return btn;
  });
  const form = h("form", { class: "grid-form", "aria-label": "Usage filter" },
    field("Tenant", tenant), field("Group by", groupBy),
    field("Since", since, "Inclusive, your local time."), field("Until", until, "Exclusive."),
    h("div", { class: "actions" }, showBtn, ...exportBtns));

  // Every record of the selection, one per line (deleted tenants' history included).
  async function exportRecords(format) {
    const blob = await api.usageExport({
      format, tenant_id: tenant.value, since: localToIso(since.value), until: localToIso(until.value),
    });
    const link = h("a", { href: URL.createObjectURL(blob), download: `usage.${format}` });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 1000);
  }
  const out = h("div", { "aria-live": "polite" });

  async function load() {
    const report = await api.usage({
      tenant_id: tenant.value, group_by: groupBy.value, since: localToIso(since.value), until: localToIso(until.value),
    });
    const keyLabel = { hour: "Hour (UTC)", day: "Day (UTC)", adapter: "Adapter" }[report.group_by];
    const num = (k) => ({ label: k[0], cell: (b) => fmtNumber(b[k[1]]), class: "num" });
    const cols = [
      { label: keyLabel, cell: (b) => (report.group_by === "adapter" ? (b.key || "(base model)") : b.key) },
      ...[["Requests", "requests"], ["Errors", "errors"], ["Prompt tokens", "prompt_tokens"],
        ["Completion tokens", "completion_tokens"], ["Total tokens", "total_tokens"]].map(num),
    ];
    const t = report.totals;
    out.replaceChildren(
      h("p", { class: "totals" }, `Totals: ${fmtNumber(t.requests)} requests, ${fmtNumber(t.errors)} errors, `
        + `${fmtNumber(t.prompt_tokens)} prompt + ${fmtNumber(t.completion_tokens)} completion = ${fmtNumber(t.total_tokens)} tokens`),
      table(`Usage by ${report.group_by}`, cols, report.data, "No usage recorded for this selection."),
    );
  }

  form.addEventListener("submit", (e) => { e.preventDefault(); act(showBtn, load); });
  main.append(h("h1", {}, "Usage"), section("Filter", form), section("Report", out));
  allTenants().then((ts) => {
    tenant.append(...ts.map((t) => h("option", { value: t.id }, t.name)));
    tenant.value = ts.some((t) => t.id === query.get("tenant_id")) ? query.get("tenant_id") : "";
    return load();
  }).catch(showError);
}
