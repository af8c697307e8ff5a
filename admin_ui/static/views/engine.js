// Live engine view: per-tenant running/waiting, batch size, KV use, resident adapters. Auto-refreshes.
// Charts: the batch by tenant and by adapter, the step-time split, and each tenant's share of the
// service over time next to its weight share (the fair scheduler made visible; kept while open).
import { allTenants, api } from "../api.js";
import { PALETTE, lineChart, stackedBar } from "../charts.js";
import { clearError, fmtNumber, h, section, showError, table } from "../dom.js";

const REFRESH_MS = 3000;
const HISTORY = 40; // refreshes kept for the share-of-service chart

const served = (t) => (t.served_prompt_tokens || 0) + (t.served_output_tokens || 0);

// One point per refresh interval: tenant -> share of the tokens served in it, and weight share
// among the tenants that were served (a weighted-fair scheduler keeps the two lines together).
function sharePoint(prev, cur, now) {
  const deltas = Object.entries(cur).map(([id, t]) => [id, served(t) - served(prev[id] || {}), t.weight ?? 1]);
  const active = deltas.filter(([, d]) => d > 0);
  const total = active.reduce((a, [, d]) => a + d, 0);
  const wsum = active.reduce((a, [, , w]) => a + w, 0);
  if (!total) return null;
  return { t: now, share: Object.fromEntries(active.map(([id, d]) => [id, d / total])),
    weight: Object.fromEntries(active.map(([id, , w]) => [id, w / wsum])) };
}

function stat(label, value) {
  return h("div", { class: "stat" }, h("span", { class: "stat-label" }, label), h("span", { class: "stat-value" }, value));
}

export function render(main) {
  let timer = null;
  let alive = true;
  let names = { tenants: {}, adapters: {} };
  let lastFailed = false;
  const history = [];
  let prevTenants = null;
  let prevSteps = null;
  const out = h("div", {}, h("p", { class: "muted" }, "Loading engine state…"));
  const updated = h("span", { class: "muted", "aria-live": "off" });
  const auto = h("input", { type: "checkbox", id: "engine-auto", checked: true });
  const refreshBtn = h("button", { type: "button" }, "Refresh now");

  async function loadNames() {
    const [ts, ads] = await Promise.all([allTenants(), api.listAdapters({ include_superseded: true })]);
    names = {
      tenants: Object.fromEntries(ts.map((t) => [t.id, t.name])),
      adapters: Object.fromEntries(ads.data.map((a) => [a.id, `${a.name} v${a.version}`])),
    };
  }
  const tName = (id) => names.tenants[id] ?? id;
  const aName = (id) => names.adapters[id] ?? id;

  function draw(s) {
    if (!s.enabled) {
      out.replaceChildren(h("p", {}, "The inference engine is disabled on this server."));
      return;
    }
    if (Array.isArray(s.replicas)) {
      // Ray Serve: one block per engine replica (docs/scale-out.md)
      out.replaceChildren(
        h("p", {}, `${s.replicas.length} engine replica(s) on Ray Serve.`),
        ...s.replicas.map((r) => h("section", { class: "replica", "aria-label": `Replica ${r.replica}` },
          h("h3", {}, `Replica ${r.replica} (pid ${r.pid})`),
          ...engineBody({ ...r, model: s.model, registered_adapters: s.registered_adapters }))),
      );
      return;
    }
    out.replaceChildren(...engineBody(s));
  }

  function engineBody(s) {
    const sch = s.scheduler || {};
    const kv = s.kv_cache || {};
    const lora = s.lora || {};
    const kvPct = Math.round((kv.usage || 0) * 1000) / 10;
    const kvId = s.replica ? `kv-usage-${s.replica}` : "kv-usage";
    const kvBar = h("progress", { id: kvId, max: kv.num_blocks || 1, value: kv.used_blocks || 0 });
    const tenants = Object.entries(sch.tenants || {}).map(([id, v]) => ({ id, ...v }));
    const hasVtc = tenants.some((t) => t.vtc_counter !== undefined);
    const resident = Object.entries(lora.resident || {});
    return [
      h("div", { class: "stats" },
        stat("Model", s.model || "—"),
        stat("Policy", sch.policy || "—"),
        stat("Batch size (running)", fmtNumber(sch.num_running)),
        stat("Waiting", fmtNumber(sch.num_waiting)),
        stat("Steps", fmtNumber(sch.step)),
        stat("KV cache use", `${kvPct}% (${fmtNumber(kv.used_blocks)} / ${fmtNumber(kv.num_blocks)} blocks)`),
        stat("Prefix cache hit rate", kv.prefix_caching ? `${Math.round((kv.prefix_cache_hit_rate || 0) * 1000) / 10}%` : "off"),
        stat("Resident adapters", `${resident.length} / ${lora.max_loras ?? "—"}`),
      ),
      h("div", { class: "field" }, h("label", { for: kvId }, "KV blocks in use"), kvBar),
      section("Charts", h("div", { class: "charts-grid" },
        stackedBar({ title: "Running sequences by tenant", parts: tenants.filter((t) => t.num_running)
          .map((t) => ({ name: tName(t.id), value: t.num_running })) }),
        stackedBar({ title: "Active requests by adapter", parts: Object.entries(lora.active_requests || {})
          .map(([k, v]) => ({ name: aName(k), value: v })) }),
        stackedBar({ title: "KV blocks: used / free", parts: [{ name: "used", value: kv.used_blocks || 0 },
          { name: "free", value: kv.free_blocks || 0, color: "#d1d5db" }] }),
        stackedBar({ title: "Engine step time split (since last refresh)", parts: stepParts(s.step_seconds || {}),
          format: (v) => `${(v * 1000).toFixed(1)} ms` })),
        shareChart()),
      section("Tenants in the engine", table("Per-tenant scheduling", [
        { label: "Tenant", cell: (t) => tName(t.id) },
        { label: "Priority", cell: (t) => (t.priority ?? "—").toString(), class: "num" },
        { label: "Weight", cell: (t) => (t.weight ?? "—").toString(), class: "num" },
        { label: "Running", cell: (t) => fmtNumber(t.num_running), class: "num" },
        { label: "Waiting", cell: (t) => fmtNumber(t.num_waiting), class: "num" },
        { label: "Prompt tokens served", cell: (t) => fmtNumber(t.served_prompt_tokens), class: "num" },
        { label: "Output tokens served", cell: (t) => fmtNumber(t.served_output_tokens), class: "num" },
        ...(hasVtc ? [{ label: "VTC counter", cell: (t) => fmtNumber(t.vtc_counter), class: "num" }] : []),
        { label: "Running adapters", cell: (t) => (t.running_adapters || []).map(aName).join(", ") || "—" },
      ], tenants, "No tenants known to the engine yet.")),
      section("Adapters", table("Resident adapters (device slots)", [
        { label: "Slot", cell: ([slot]) => slot, class: "num" },
        { label: "Adapter", cell: ([, key]) => aName(key) },
        { label: "Active requests", cell: ([, key]) => fmtNumber((lora.active_requests || {})[key] || 0), class: "num" },
      ], resident, "No adapter is resident on the device."),
      h("p", {}, `Registered with the engine: ${(s.registered_adapters || []).map(aName).join(", ") || "none"}`),
      h("p", {}, `In the CPU cache: ${(lora.cpu_cached || []).map(aName).join(", ") || "none"}`)),
      section("Counters", h("dl", { class: "counters" }, Object.entries(s.counters || {}).flatMap(([k, v]) => [h("dt", {}, k.replaceAll("_", " ")), h("dd", {}, fmtNumber(v))]))),
    ];
  }

  function stepParts(steps) {
    const parts = Object.entries(steps).map(([phase, secs]) => ({ name: phase, value: Math.max(0, secs - ((prevSteps || {})[phase] || 0)) }));
    prevSteps = steps;
    return parts;
  }

  function track(s) {
    const cur = s.scheduler?.tenants || {};
    if (prevTenants) {
      const p = sharePoint(prevTenants, cur, Date.now());
      if (p) history.push(p);
      if (history.length > HISTORY) history.shift();
    }
    prevTenants = cur;
  }

  function shareChart() {
    const ids = [...new Set(history.flatMap((p) => Object.keys(p.share)))];
    const series = ids.flatMap((id, i) => {
      const color = PALETTE[i % PALETTE.length];
      const pts = history.filter((p) => id in p.share);
      return [{ name: `${tName(id)} share`, color, points: pts.map((p) => [p.t, p.share[id]]) },
        { name: `${tName(id)} weight share`, color, dashed: true, points: pts.map((p) => [p.t, p.weight[id]]) }];
    });
    return lineChart({ title: "Share of service per refresh (solid) vs weight share (dashed)", series, yMax: 1,
      xFormat: (x) => new Date(x).toLocaleTimeString(), yFormat: (v) => `${Math.round(v * 100)}%` });
  }

  async function refresh() {
    try {
      const s = await api.engine();
      track(s);
      // New tenant/adapter ids appear: refresh the names once.
      const unknown = Object.keys(s.scheduler?.tenants || {}).some((id) => !(id in names.tenants))
        || (s.registered_adapters || []).some((id) => !(id in names.adapters));
      if (unknown) await loadNames();
      if (!alive) return;
      draw(s);
      updated.textContent = `Updated ${new Date().toLocaleTimeString()}`;
      if (lastFailed) clearError(); // the engine answers again: the refresh error is stale
      lastFailed = false;
    } catch (err) {
      if (!alive) return;
      showError(err);
      lastFailed = true;
      updated.textContent = "Refresh failed";
    }
  }

  function schedule() {
    clearTimeout(timer);
    if (alive && auto.checked) timer = setTimeout(async () => { await refresh(); schedule(); }, REFRESH_MS);
  }
  auto.addEventListener("change", schedule);
  refreshBtn.addEventListener("click", async () => { refreshBtn.disabled = true; await refresh(); refreshBtn.disabled = false; });

  main.append(
    h("h1", {}, "Engine"),
    h("div", { class: "toolbar" },
      h("div", { class: "field checkbox" }, auto, h("label", { for: "engine-auto" }, `Auto-refresh every ${REFRESH_MS / 1000} s`)),
      refreshBtn, updated),
    out,
  );
  loadNames().catch(showError).then(refresh).then(schedule);
  return () => { alive = false; clearTimeout(timer); };
}
