// Small SVG charts drawn by us (no library, no CDN). Colours and sizes are SVG presentation
// attributes, not inline CSS, so the page's strict CSP (no 'unsafe-inline') holds. Every chart has
// a <title>, an aria-label and an HTML legend; the numbers stay readable in tables next to it.
import { fmtNumber, h } from "./dom.js";

const NS = "http://www.w3.org/2000/svg";
export const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777",
  "#4b5563", "#65a30d"];

function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) el.setAttribute(k, String(v));
  for (const c of children) el.append(c);
  return el;
}

function legend(items) {
  return h("ul", { class: "legend" }, ...items.map(({ name, color, note }) =>
    h("li", {}, svgSwatch(color), ` ${name}${note ? ` — ${note}` : ""}`)));
}

function svgSwatch(color) {
  return s("svg", { width: 12, height: 12, "aria-hidden": "true" }, s("rect", { width: 12, height: 12, fill: color }));
}

// series: [{ name, points: [[x(number), y], ...], dashed? }]; xFormat(x) labels the x axis.
export function lineChart({ title, series, xFormat = String, yFormat = fmtNumber, height = 220, width = 640, yMax }) {
  const pad = { l: 56, r: 12, t: 12, b: 28 };
  const xs = series.flatMap((sr) => sr.points.map((p) => p[0]));
  const ys = series.flatMap((sr) => sr.points.map((p) => p[1]));
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": title, class: "chart",
    "data-series": series.length, "data-points": ys.length }, s("title", {}, title));
  if (!xs.length) {
    svg.append(s("text", { x: width / 2, y: height / 2, "text-anchor": "middle", fill: "#6b7280" }, "No data yet"));
    return h("figure", { class: "chart-box" }, svg, h("figcaption", {}, title));
  }
  const x0 = Math.min(...xs), x1 = Math.max(...xs);
  const top = yMax ?? Math.max(...ys, 1e-9) * 1.1;
  const X = (x) => pad.l + (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0)) * (width - pad.l - pad.r);
  const Y = (y) => height - pad.b - (y / top) * (height - pad.t - pad.b);
  for (let i = 0; i <= 4; i++) {
    const v = (top * i) / 4;
    svg.append(s("line", { x1: pad.l, x2: width - pad.r, y1: Y(v), y2: Y(v), stroke: "#e5e7eb" }),
      s("text", { x: pad.l - 6, y: Y(v) + 4, "text-anchor": "end", "font-size": 11, fill: "#4b5563" }, yFormat(v)));
  }
  const ticks = [...new Set([x0, (x0 + x1) / 2, x1])];
  for (const t of ticks) {
    svg.append(s("text", { x: X(t), y: height - 8, "text-anchor": "middle", "font-size": 11, fill: "#4b5563" }, xFormat(t)));
  }
  series.forEach((sr, i) => {
    const color = sr.color || PALETTE[i % PALETTE.length];
    const pts = sr.points.map(([x, y]) => `${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join(" ");
    svg.append(s("polyline", { points: pts, fill: "none", stroke: color, "stroke-width": 2,
      "stroke-dasharray": sr.dashed ? "6 4" : null, "data-name": sr.name }));
    for (const [x, y] of sr.points) {
      svg.append(s("circle", { cx: X(x), cy: Y(y), r: 2.5, fill: color }, s("title", {}, `${sr.name}: ${yFormat(y)} at ${xFormat(x)}`)));
    }
  });
  return h("figure", { class: "chart-box" }, svg, h("figcaption", {}, title),
    legend(series.map((sr, i) => ({ name: sr.name, color: sr.color || PALETTE[i % PALETTE.length], note: sr.note }))));
}

// parts: [{ name, value }] drawn as one horizontal stacked bar (e.g. the batch by tenant).
export function stackedBar({ title, parts, format = fmtNumber, width = 640, total }) {
  const sum = total ?? parts.reduce((a, p) => a + p.value, 0);
  const svg = s("svg", { viewBox: `0 0 ${width} 28`, role: "img", "aria-label": title, class: "chart bar",
    "data-parts": parts.length }, s("title", {}, title), s("rect", { width, height: 28, fill: "#f3f4f6" }));
  if (!(sum > 0)) svg.append(s("text", { x: 8, y: 18, "font-size": 12, fill: "#6b7280" }, "none right now"));
  let x = 0;
  parts.forEach((p, i) => {
    const w = sum > 0 ? (p.value / sum) * width : 0;
    svg.append(s("rect", { x, width: w, height: 28, fill: p.color || PALETTE[i % PALETTE.length], "data-name": p.name },
      s("title", {}, `${p.name}: ${format(p.value)}`)));
    x += w;
  });
  return h("figure", { class: "chart-box" }, svg, h("figcaption", {}, title),
    legend(parts.map((p, i) => ({ name: p.name, color: p.color || PALETTE[i % PALETTE.length], note: format(p.value) }))));
}

// used / limit as a labelled meter bar; limit null = unlimited.
export function meter(label, used, limit) {
  const id = `m-${Math.random().toString(36).slice(2, 8)}`;
  const text = limit ? `${fmtNumber(used)} of ${fmtNumber(limit)}` : `${fmtNumber(used)} (no limit)`;
  return h("div", { class: "field meter-row" },
    h("label", { for: id }, label),
    h("meter", { id, min: 0, max: limit || Math.max(used, 1), value: used, low: (limit || 1) * 0.7, high: (limit || 1) * 0.9,
      optimum: 0 }),
    h("span", { class: "muted", "data-meter": label }, text));
}
