// The console's one script, for pages that name a stream (`data-live` on <main>: a cluster's
// events, or the org's `changed`): each change the stream brings fetches the page again and
// puts its <main> in place, so the page follows without a reload, and keyboard focus stays
// where it was. Without this script the page is the same, only as of its loading.
"use strict";
(() => {
  const main = document.getElementById("main");
  const stream = main && main.dataset.live;
  if (!stream || !window.EventSource) {
    return;
  }
  let queued = null;
  const focused = () => {
    const at = document.activeElement;
    if (!at || !main.contains(at)) {
      return null;
    }
    return at.id ? "#" + CSS.escape(at.id)
      : at.getAttribute("href") ? `a[href="${CSS.escape(at.getAttribute("href"))}"]` : null;
  };
  const refresh = async () => {
    queued = null;
    const answer = await fetch(location.href, { credentials: "same-origin" });
    if (answer.redirected || !answer.ok) {
      location.reload();
      return;
    }
    const page = new DOMParser().parseFromString(await answer.text(), "text/html");
    const fresh = page.getElementById("main");
    if (!fresh) {
      return;
    }
    const again = focused();
    main.innerHTML = fresh.innerHTML;
    main.dataset.updated = new Date().toISOString();
    const back = again && main.querySelector(again);
    if (back) {
      back.focus();
    }
  };
  const soon = () => {
    queued = queued || setTimeout(() => refresh().catch(() => {}), 250);
  };
  const source = new EventSource(stream);
  for (const kind of ["changed", "cluster", "node", "removed", "report", "remediation",
                      "snapshot", "restore", "upgrade"]) {
    source.addEventListener(kind, soon);
  }
  // A cluster's stream opens with its status, which the page was just rendered with.
  let opened = false;
  source.addEventListener("status", () => {
    if (opened) {
      soon();
    }
    opened = true;
  });
  source.addEventListener("open", () => {
    opened = false;
  });
  source.addEventListener("deleted", () => {
    source.close();
    location.assign("/ui/clusters");
  });
})();
