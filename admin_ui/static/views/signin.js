// Sign in with the admin key. The key is checked against the API before it is kept (sessionStorage).
import { api, setKey, sso, ssoLoginUrl } from "../api.js";
import { act, field, h } from "../dom.js";

export function render(main, { onSignedIn }) {
  const keyInput = h("input", { type: "password", name: "admin_key", autocomplete: "off", required: true, spellcheck: "false" });
  const submit = h("button", { type: "submit" }, "Sign in");
  const form = h("form", { class: "card signin", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, "Sign in"),
    h("p", {}, "Use the admin key printed by the server on first start (or LORAPLEX_ADMIN_KEY). It is kept only in this browser tab."),
    field("Admin key", keyInput),
    h("div", { class: "actions" }, submit),
  );
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const key = keyInput.value.trim();
    act(submit, async () => {
      await api.checkKey(key);
      setKey(key);
      onSignedIn();
    });
  });
  if (sso().enabled) {
    // A plain link: the sign-in is a top-level navigation to the identity provider and back.
    const ssoCard = h("div", { class: "card signin" },
      h("h2", {}, "Single sign-on"),
      h("p", {}, "Sign in with your organisation's account; your role decides what you may change."),
      h("div", { class: "actions" }, h("a", { class: "button", href: ssoLoginUrl(), id: "sso-signin" }, "Sign in with SSO")),
    );
    main.append(ssoCard);
  }
  main.append(form);
  keyInput.focus();
}
