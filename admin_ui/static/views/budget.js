// A tenant's budget in currency: the amount, period and timezone (set, replace, remove) and the
// spend of the current period (settled, held by running requests, left) as the server computes it.
// Amounts stay decimal text end to end (no float arithmetic on money); only the meter's bar uses numbers.
import { request } from "../api.js";
import { act, confirmDialog, field, fmtTime, h, section, select, showError, showStatus } from "../dom.js";

const PERIODS = [["monthly", "monthly"], ["weekly", "weekly (from Monday)"], ["daily", "daily"], ["total", "total (never resets)"]];

export function budgetSection(t) {
  const path = `/tenants/${encodeURIComponent(t.id)}/budget`;
  const inputs = {
    amount: h("input", { name: "budget_amount", inputmode: "decimal", autocomplete: "off", placeholder: "no budget" }),
    period: select("budget_period_currency", PERIODS, "monthly"),
    timezone: h("input", { name: "budget_timezone", value: "UTC", autocomplete: "off", maxlength: 64 }),
  };
  const save = h("button", { type: "submit" }, "Save budget");
  const remove = h("button", { type: "button", class: "danger", disabled: true }, "Remove budget");
  const spend = h("div", { "aria-live": "polite", "data-budget-spend": "" });
  const fieldset = h("fieldset", { class: "grid-form plain", disabled: true },
    h("legend", { class: "visually-hidden" }, "Budget"),
    field("Budget amount", inputs.amount, "Decimal, in the price book's currency, e.g. 25.00."),
    field("Budget reset", inputs.period),
    field("Budget timezone", inputs.timezone, "IANA name, e.g. Europe/Paris: the period resets at its midnight."),
    h("div", { class: "actions" }, save, remove));
  const form = h("form", { "aria-label": "Budget in currency" }, fieldset);

  const show = (b) => {
    remove.disabled = !b;
    if (!b) {
      spend.replaceChildren(h("p", { class: "muted" }, "No budget: requests are not capped in currency."));
      return;
    }
    inputs.amount.value = b.amount;
    inputs.period.value = b.period;
    inputs.timezone.value = b.timezone;
    const id = `budget-meter-${t.id}`;
    const limit = Number(b.amount) || 0;
    const used = Number(b.spent) + Number(b.reserved);
    spend.replaceChildren(
      h("div", { class: "field meter-row" },
        h("label", { for: id }, `Spent this ${b.period === "total" ? "budget" : "period"}`),
        h("meter", { id, min: 0, max: limit || 1, value: Math.min(used, limit || 1), low: limit * 0.5, high: limit * 0.8, optimum: 0 }),
        h("span", { class: "muted", "data-budget-spent": b.spent, "data-budget-amount": b.amount },
          `${b.spent} of ${b.amount} ${b.currency}`)),
      h("p", { class: "hint" },
        `Held by running requests: ${b.reserved} ${b.currency}. Left: `, h("strong", { "data-budget-remaining": b.remaining }, `${b.remaining} ${b.currency}`),
        `. Period started ${fmtTime(b.window_start)}`, b.window_end ? `, resets ${fmtTime(b.window_end)}.` : "; it never resets."));
  };

  const load = () => request("GET", path).then(
    (b) => { show(b); fieldset.disabled = false; },
    (err) => {
      fieldset.disabled = false;
      if (err.status === 404) show(null);
      else showError(err);
    });

  form.addEventListener("submit", (e) => {
    e.preventDefault();
    act(save, async () => {
      const body = { amount: inputs.amount.value.trim(), period: inputs.period.value, timezone: inputs.timezone.value.trim() };
      show(await request("PUT", path, { body }));
      showStatus(`Budget of ${t.name} saved.`);
    });
  });
  remove.addEventListener("click", async () => {
    if (!(await confirmDialog(`Remove the budget of ${t.name}? Its requests are no longer capped in currency.`, "Remove budget"))) return;
    await act(remove, async () => {
      await request("DELETE", path);
      inputs.amount.value = "";
      show(null);
      showStatus(`Budget of ${t.name} removed.`);
    });
  });
  load();
  const again = h("button", { type: "button", onclick: () => act(again, load) }, "Refresh budget");
  return section("Budget in currency", form, spend, h("div", { class: "actions" }, again));
}
