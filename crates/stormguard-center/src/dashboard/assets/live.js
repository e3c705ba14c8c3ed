// stormguard dashboard: refreshes the live parts of a page in place.
//
// Every element with data-refresh="URL" is replaced, every data-every seconds (2 by
// default), by the HTML fragment the center serves at URL. Without this script the pages
// work the same; they just show the state as of their loading. A failed fetch keeps what is
// shown and tries again at the next tick; a signed-out session (the fragment answers with
// the sign-in page) reloads the page, which then leads to the sign-in form.
"use strict";

function refresh(element) {
  const every = Math.max(1, Number(element.dataset.every || 2)) * 1000;
  const tick = async () => {
    try {
      const answer = await fetch(element.dataset.refresh, {
        credentials: "same-origin",
        headers: { Accept: "text/html" },
      });
      if (answer.redirected && new URL(answer.url).pathname === "/ui/login") {
        window.location.reload();
        return;
      }
      if (answer.ok) {
        element.innerHTML = await answer.text();
        element.dataset.refreshed = String(Number(element.dataset.refreshed || 0) + 1);
      }
    } catch (_) {
      // The center is unreachable for a moment: keep what is shown.
    }
    window.setTimeout(tick, every);
  };
  window.setTimeout(tick, every);
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-refresh]").forEach(refresh);
});
