// Live updates for the console (the only script; every page works without it).
// Listens to the server-sent change events and reloads the page's main content when a record it
// shows changes: a call's page watches its own record, the other pages any change. At most once
// a second, and never while an input of a form has the focus.
(function () {
  "use strict";
  var body = document.body, watch = body.dataset.watch;
  if (!watch || !window.EventSource) return;
  var pending = false, busy = false;
  function refresh() {
    pending = false;
    var active = document.activeElement;
    if (active && active.form) { pending = true; setTimeout(refresh, 1000); return; }
    if (busy) { pending = true; return; }
    busy = true;
    fetch(location.href, {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("main");
        if (fresh) document.getElementById("main").replaceWith(fresh);
      })
      .finally(function () { busy = false; if (pending) setTimeout(refresh, 1000); });
  }
  var source = new EventSource(body.dataset.events);
  var live = document.getElementById("live");
  source.onopen = function () { if (live) live.hidden = false; };
  source.onerror = function () { if (live) live.hidden = true; };
  source.addEventListener("change", function (event) {
    if (watch !== "*" && event.data !== watch) return;
    if (!pending) { pending = true; setTimeout(refresh, 300); }
  });
})();
