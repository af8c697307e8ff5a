// The admin REST API client. The admin key lives in sessionStorage only (never in a URL), and every
// failure becomes an ApiError whose message is the server's error message, verbatim. Signed in with
// SSO instead, the browser sends the HttpOnly session cookie by itself and every change carries the
// session's CSRF token (X-CSRF-Token) and, through the request's referrer policy, its Origin.

const KEY_STORAGE = "loraplex.adminKey";

// The page is served at <prefix>/admin/; the API lives at <prefix>/admin/v1.
const API_BASE = window.location.pathname.replace(/\/admin\/.*$/, "") + "/admin/v1";

export class ApiError extends Error {
  constructor(message, { status = 0, type = null, code = null, param = null } = {}) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.type = type;
    this.code = code;
    this.param = param;
  }
}

export function getKey() {
  return window.sessionStorage.getItem(KEY_STORAGE);
}

export function setKey(key) {
  window.sessionStorage.setItem(KEY_STORAGE, key);
}

export function clearKey() {
  window.sessionStorage.removeItem(KEY_STORAGE);
}

// /admin/sso/session: { enabled, signed_in, email, roles, csrf_token } (SSO sign-in, docs/sso.md).
const SSO_BASE = API_BASE.replace(/\/v1$/, "/sso");
let ssoSession = { enabled: false, signed_in: false };

export function sso() {
  return ssoSession;
}

export async function loadSsoSession() {
  try {
    const response = await fetch(`${SSO_BASE}/session`, { headers: { Accept: "application/json" } });
    ssoSession = response.ok ? await response.json() : { enabled: false, signed_in: false };
  } catch {
    ssoSession = { enabled: false, signed_in: false };
  }
  return ssoSession;
}

export const ssoLoginUrl = () => `${SSO_BASE}/login`;

export async function ssoLogout() {
  const headers = { "X-CSRF-Token": ssoSession.csrf_token || "" };
  await fetch(`${SSO_BASE}/logout`, { method: "POST", headers, referrerPolicy: "same-origin" }).catch(() => null);
  ssoSession = { ...ssoSession, signed_in: false, csrf_token: null };
}

function authHeaders(method, key) {
  const token = key ?? getKey();
  if (token) return { Authorization: `Bearer ${token}` };
  if (ssoSession.signed_in && method !== "GET" && method !== "HEAD") return { "X-CSRF-Token": ssoSession.csrf_token };
  return {};
}

function queryString(params) {
  const qs = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== undefined && v !== null && v !== "") qs.append(k, String(v));
  }
  const s = qs.toString();
  return s ? `?${s}` : "";
}

async function errorFrom(response) {
  const text = await response.text().catch(() => "");
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  const err = body && typeof body === "object" ? body.error : null;
  if (err && typeof err.message === "string") {
    return new ApiError(err.message, { status: response.status, type: err.type, code: err.code, param: err.param });
  }
  // Not our error format (a proxy in between, say): show what came back rather than nothing.
  const detail = text.trim().slice(0, 300) || response.statusText || "no response body";
  return new ApiError(`HTTP ${response.status}: ${detail}`, { status: response.status });
}

/** Call the admin API. `body` may be a plain object (sent as JSON) or FormData (multipart). */
export async function request(method, path, { query, body, key } = {}) {
  const headers = { Accept: "application/json", ...authHeaders(method, key) };
  let payload;
  if (body instanceof FormData) {
    payload = body;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  let response;
  try {
    // The page's own policy is no-referrer, under which a browser sends "Origin: null" with a POST;
    // same-origin lets the server see that a cookie-authenticated change comes from this page.
    response = await fetch(API_BASE + path + queryString(query), { method, headers, body: payload, referrerPolicy: "same-origin" });
  } catch (exc) {
    throw new ApiError(`network error: could not reach the server (${exc.message})`);
  }
  if (!response.ok) throw await errorFrom(response);
  if (response.status === 204) return null;
  try {
    return await response.json();
  } catch {
    throw new ApiError(`HTTP ${response.status}: the server sent a response that is not JSON`, { status: response.status });
  }
}

/** A file from the admin API (with the key in the header, so not a plain link): a Blob. */
async function download(path, query) {
  const headers = authHeaders("GET");
  let response;
  try {
    response = await fetch(API_BASE + path + queryString(query), { headers });
  } catch (exc) {
    throw new ApiError(`network error: could not reach the server (${exc.message})`);
  }
  if (!response.ok) throw await errorFrom(response);
  return response.blob();
}

const enc = encodeURIComponent;

export const api = {
  checkKey: (key) => request("GET", "/tenants", { query: { limit: 1 }, key }),

  listTenants: (query) => request("GET", "/tenants", { query }),
  getTenant: (id) => request("GET", `/tenants/${enc(id)}`),
  createTenant: (body) => request("POST", "/tenants", { body }),
  updateTenant: (id, body) => request("PATCH", `/tenants/${enc(id)}`, { body }),
  deleteTenant: (id) => request("DELETE", `/tenants/${enc(id)}`),

  listKeys: (tenantId) => request("GET", `/tenants/${enc(tenantId)}/keys`),
  createKey: (tenantId, body) => request("POST", `/tenants/${enc(tenantId)}/keys`, { body }),
  revokeKey: (keyId) => request("DELETE", `/keys/${enc(keyId)}`),

  listProjects: (tenantId) => request("GET", `/tenants/${enc(tenantId)}/projects`),
  createProject: (tenantId, body) => request("POST", `/tenants/${enc(tenantId)}/projects`, { body }),
  updateProject: (id, body) => request("PATCH", `/projects/${enc(id)}`, { body }),
  archiveProject: (id) => request("DELETE", `/projects/${enc(id)}`),

  getQuota: (tenantId) => request("GET", `/tenants/${enc(tenantId)}/quota`),
  putQuota: (tenantId, body) => request("PUT", `/tenants/${enc(tenantId)}/quota`, { body }),

  listAdapters: (query) => request("GET", "/adapters", { query }),
  uploadAdapter: (formData) => request("POST", "/adapters", { body: formData }),
  registerAdapter: (body) => request("POST", "/adapters", { body }),
  deleteAdapter: (id) => request("DELETE", `/adapters/${enc(id)}`),
  addGrant: (adapterId, tenantId) => request("POST", `/adapters/${enc(adapterId)}/grants`, { body: { tenant_id: tenantId } }),
  removeGrant: (adapterId, tenantId) => request("DELETE", `/adapters/${enc(adapterId)}/grants`, { query: { tenant_id: tenantId } }),

  usage: (query) => request("GET", "/usage", { query }),
  usageSeries: (query) => request("GET", "/usage/series", { query }),
  quotaConsumption: (tenantId) => request("GET", `/tenants/${enc(tenantId)}/quota/consumption`),
  usageExport: (query) => download("/usage/export", query),
  prices: () => request("GET", "/prices"),
  createPrice: (body) => request("POST", "/prices", { body }),
  spend: (query) => request("GET", "/spend", { query }),
  spendExport: (query) => download("/spend/export", query),
  engine: () => request("GET", "/engine"),
  audit: (query) => request("GET", "/audit", { query }),
  webhooks: () => request("GET", "/webhooks"),
  alertEvents: (query) => request("GET", "/alerts/events", { query }),
};

/** All tenants (the list is paged by the server). */
export async function allTenants() {
  const out = [];
  for (let offset = 0; ; offset += 1000) {
    const page = await api.listTenants({ limit: 1000, offset });
    out.push(...page.data);
    if (out.length >= page.total || page.data.length === 0) return out;
  }
}
