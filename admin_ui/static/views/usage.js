// Usage: requests, errors and tokens per hour, day or adapter, for one tenant or all; charts of
// usage over time per tenant and per adapter.
import { allTenants, api } from "../api.js";
import { lineChart } from "../charts.js";
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

  const metric = select("metric", [["tokens", "tokens (prompt + completion)"], ["requests", "requests"]], "tokens");
  const bucket = select("bucket", [["hour", "hour"], ["day", "day"]], "hour");
  const charts = h("div", { class: "charts-grid", "aria-live": "polite" });
  let names = {};

  async function loadCharts() {
    const q = { tenant_id: tenant.value, bucket: bucket.value, since: localToIso(since.value), until: localToIso(until.value) };
    const [byTenant, byAdapter] = await Promise.all([api.usageSeries({ ...q, by: "tenant" }), api.usageSeries({ ...q, by: "adapter" })]);
    const value = (p) => (metric.value === "requests" ? p.requests : p.prompt_tokens + p.completion_tokens);
    const toSeries = (report, label) => {
      const times = [...new Set(report.data.map((p) => p.time))].sort();
      const keys = [...new Set(report.data.map((p) => p.key))];
      const at = new Map(report.data.map((p) => [`${p.time}|${p.key}`, value(p)]));
      // Every bucket of the range for every key (a quiet hour is a 0, not a gap).
      return keys.map((k) => ({ name: label(k), points: times.map((t) => [Date.parse(t), at.get(`${t}|${k}`) || 0]) }));
    };
    const fmtT = (x) => new Date(x).toISOString().slice(bucket.value === "hour" ? 5 : 0, bucket.value === "hour" ? 16 : 10).replace("T", " ");
    charts.replaceChildren(
      lineChart({ title: `${metric.value === "requests" ? "Requests" : "Tokens"} per ${bucket.value} by tenant`,
        series: toSeries(byTenant, (k) => names[k] || k), xFormat: fmtT }),
      lineChart({ title: `${metric.value === "requests" ? "Requests" : "Tokens"} per ${bucket.value} by adapter`,
        series: toSeries(byAdapter, (k) => k || "(base model)"), xFormat: fmtT }),
    );
  }

  const chartBtn = h("button", { type: "button", onclick: () => act(chartBtn, loadCharts) }, "Draw charts");
  form.addEventListener("submit", (e) => { e.preventDefault(); act(showBtn, async () => { await load(); await loadCharts(); }); });
  main.append(h("h1", {}, "Usage"), section("Filter", form), section("Report", out),
    section("Usage over time", h("div", { class: "grid-form", role: "group", "aria-label": "Chart options" },
      field("Chart", metric), field("Bucket", bucket), h("div", { class: "actions" }, chartBtn)), charts));
  allTenants().then((ts) => {
    names = Object.fromEntries(ts.map((t) => [t.id, t.name]));
    tenant.append(...ts.map((t) => h("option", { value: t.id }, t.name)));
    tenant.value = ts.some((t) => t.id === query.get("tenant_id")) ? query.get("tenant_id") : "";
    return Promise.all([load(), loadCharts()]);
  }).catch(showError);
}
