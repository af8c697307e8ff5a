// Entry point: sign-in gate, hash router (#/tenants, #/tenants/<id>, #/adapters, #/usage, #/engine,
// #/audit, #/alerts) and the page frame. Each view module exports `render(main, params) -> cleanup?`.
import { clearKey, getKey, loadSsoSession, sso, ssoLogout } from "./api.js";
import { clearError } from "./dom.js";
import * as signin from "./views/signin.js";
import * as tenants from "./views/tenants.js";
import * as tenant from "./views/tenant.js";
import * as adapters from "./views/adapters.js";
import * as usage from "./views/usage.js";
import * as spend from "./views/spend.js";
import * as engine from "./views/engine.js";
import * as audit from "./views/audit.js";
import * as alerts from "./views/alerts.js";

const ROUTES = [
  [/^\/tenants$/, tenants],
  [/^\/tenants\/([^/]+)$/, tenant],
  [/^\/adapters$/, adapters],
  [/^\/usage$/, usage],
  [/^\/spend$/, spend],
  [/^\/engine$/, engine],
  [/^\/audit$/, audit],
  [/^\/alerts$/, alerts],
];

let cleanup = null;

function parseHash() {
  const raw = window.location.hash.replace(/^#/, "") || "/tenants";
  const [path, qs] = raw.split("?");
  return { path, query: new URLSearchParams(qs || "") };
}

export function navigate(hash) {
  if (window.location.hash === hash) route();
  else window.location.hash = hash;
}

function route() {
  if (typeof cleanup === "function") cleanup();
  cleanup = null;
  clearError();
  const main = document.getElementById("main");
  main.replaceChildren();
  const signedIn = Boolean(getKey()) || sso().signed_in;
  document.getElementById("nav").hidden = !signedIn;
  document.getElementById("signout").hidden = !signedIn;
  showWho();
  if (!signedIn) {
    cleanup = signin.render(main, { onSignedIn: () => navigate("#/tenants") });
    return;
  }
  const { path, query } = parseHash();
  for (const link of document.querySelectorAll("#nav a")) {
    const current = path === link.getAttribute("href").slice(1) || path.startsWith(`${link.getAttribute("href").slice(1)}/`);
    if (current) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  for (const [pattern, view] of ROUTES) {
    const m = pattern.exec(path);
    if (m) {
      cleanup = view.render(main, { match: m.slice(1).map(decodeURIComponent), query, navigate });
      return;
    }
  }
  navigate("#/tenants");
}

// Who is signed in: the SSO user and roles (a viewer or tenant admin sees the server's 403s for
// what their role does not allow), or the admin key.
function showWho() {
  const who = document.getElementById("whoami");
  const session = sso();
  if (getKey()) who.textContent = "admin key";
  else if (session.signed_in) who.textContent = `${session.email} · ${session.roles.join(", ")}`;
  who.hidden = !(getKey() || session.signed_in);
}

document.getElementById("signout").addEventListener("click", async () => {
  if (getKey()) clearKey();
  else await ssoLogout();
  navigate("#/");
});
document.getElementById("error-dismiss").addEventListener("click", clearError);
window.addEventListener("hashchange", route);
loadSsoSession().then(route);
