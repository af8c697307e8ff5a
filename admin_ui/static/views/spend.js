// Spend: the price book (add a price; history is kept) and what usage cost, per tenant, key,
// model or day, each record at the price in force when it was served. Amounts come from the API
// as exact decimal text and are shown as such; only the chart turns them into numbers.
import { allTenants, api } from "../api.js";
import { stackedBar } from "../charts.js";
import { act, field, fmtNumber, fmtTime, h, localToIso, section, select, showError, showStatus, table } from "../dom.js";

export function render(main, { query }) {
  // ---- the price book ----
  const model = h("input", { name: "model", placeholder: "* or a model / adapter name", value: "*" });
  const inRate = h("input", { name: "input_per_mtok", inputmode: "decimal", placeholder: "0.15" });
  const cachedRate = h("input", { name: "cached_input_per_mtok", inputmode: "decimal", placeholder: "same as input" });
  const outRate = h("input", { name: "output_per_mtok", inputmode: "decimal", placeholder: "0.60" });
  const currency = h("input", { name: "currency", value: "USD", maxlength: 3 });
  const from = h("input", { name: "effective_from", type: "datetime-local" });
  const addBtn = h("button", { type: "submit" }, "Add price");
  const priceForm = h("form", { class: "grid-form", "aria-label": "New price" },
    field("Model", model, "Adapter > its base model > *."),
    field("Input per 1M tokens", inRate), field("Cached input per 1M tokens", cachedRate),
    field("Output per 1M tokens", outRate), field("Currency", currency),
    field("Effective from", from, "Empty = now; never in the past."),
    h("div", { class: "actions" }, addBtn));
  const prices = h("div", { "aria-live": "polite" });

  async function loadPrices() {
    const book = await api.prices();
    prices.replaceChildren(table("Price book", [
      { label: "Model", cell: (p) => p.model },
      { label: "Input / 1M", cell: (p) => p.input_per_mtok, class: "num" },
      { label: "Cached input / 1M", cell: (p) => p.cached_input_per_mtok, class: "num" },
      { label: "Output / 1M", cell: (p) => p.output_per_mtok, class: "num" },
      { label: "Currency", cell: (p) => p.currency },
      { label: "Effective from", cell: (p) => fmtTime(p.effective_from) },
    ], book.data, "No prices yet: every request is unpriced."));
  }

  priceForm.addEventListener("submit", (e) => {
    e.preventDefault();
    act(addBtn, async () => {
      const body = { model: model.value.trim(), input_per_mtok: inRate.value.trim(), output_per_mtok: outRate.value.trim(),
        currency: currency.value.trim() || "USD" };
      if (cachedRate.value.trim()) body.cached_input_per_mtok = cachedRate.value.trim();
      if (from.value) body.effective_from = localToIso(from.value);
      await api.createPrice(body);
      showStatus(`Price for ${body.model} added.`);
      await Promise.all([loadPrices(), load()]);
    });
  });

  // ---- spend ----
  const tenant = h("select", { name: "tenant_id" }, h("option", { value: "" }, "All tenants"));
  const groupBy = select("group_by", [["tenant", "tenant"], ["project", "project"], ["key", "API key"], ["model", "model"], ["day", "day"]],
    query.get("group_by") || "tenant");
  const start = h("input", { name: "start", type: "datetime-local" });
  const end = h("input", { name: "end", type: "datetime-local" });
  const showBtn = h("button", { type: "submit" }, "Show spend");
  const exportBtn = h("button", { type: "button" }, "Export CSV");
  const form = h("form", { class: "grid-form", "aria-label": "Spend filter" },
    field("Tenant", tenant), field("Group by", groupBy),
    field("Start", start, "Inclusive, your local time."), field("End", end, "Exclusive."),
    h("div", { class: "actions" }, showBtn, exportBtn));
  const out = h("div", { "aria-live": "polite" });
  let names = {};
  const window_ = () => ({ tenant_id: tenant.value, start: localToIso(start.value), end: localToIso(end.value) });

  async function load() {
    const report = await api.spend({ ...window_(), group_by: groupBy.value });
    const cur = report.currency || "";
    const label = (b) => (report.group_by === "tenant" ? (names[b.key] || b.key) : (b.key || "(none)"));
    const num = (name, key) => ({ label: name, cell: (b) => fmtNumber(b[key]), class: "num" });
    const t = report.totals;
    out.replaceChildren(
      h("p", { class: "totals", "data-total-cost": t.cost }, `Total: ${t.cost} ${cur} for ${fmtNumber(t.requests)} requests`
        + (t.unpriced_requests ? ` (${fmtNumber(t.unpriced_requests)} unpriced)` : "")),
      stackedBar({ title: `Spend by ${report.group_by} (${cur || "no prices"})`,
        parts: report.data.map((b) => ({ name: label(b), value: Number(b.cost) })), format: (v) => `${v} ${cur}` }),
      table(`Spend by ${report.group_by}`, [
        { label: { tenant: "Tenant", project: "Project", key: "API key", model: "Model", day: "Day (UTC)" }[report.group_by], cell: label },
        num("Requests", "requests"), num("Prompt tokens", "prompt_tokens"), num("Cached tokens", "cached_tokens"),
        num("Completion tokens", "completion_tokens"),
        { label: `Cost (${cur})`, cell: (b) => b.cost, class: "num" },
        num("Unpriced", "unpriced_requests"),
      ], report.data, "No usage in this selection."),
    );
  }

  exportBtn.addEventListener("click", () => act(exportBtn, async () => {
    const blob = await api.spendExport(window_());
    const link = h("a", { href: URL.createObjectURL(blob), download: "spend.csv" });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 1000);
  }));
  form.addEventListener("submit", (e) => { e.preventDefault(); act(showBtn, load); });

  main.append(h("h1", {}, "Spend"), section("Spend by tenant, key, model or day", form, out), section("Price book", priceForm, prices));
  allTenants().then((ts) => {
    names = Object.fromEntries(ts.map((x) => [x.id, x.name]));
    tenant.append(...ts.map((x) => h("option", { value: x.id }, x.name)));
    return Promise.all([loadPrices(), load()]);
  }).catch(showError);
}
