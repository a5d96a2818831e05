// graphile-worker dashboard: refresh the page's content in place every
// data-refresh seconds (0: never), while the tab is visible and no form field
// has the focus. The button in the top bar pauses it (remembered per browser).
// Served from the dashboard itself: the Content-Security-Policy allows no
// other script.
"use strict";
(function () {
  var seconds = Number(document.body.getAttribute("data-refresh") || 0);
  var toggle = document.getElementById("refresh-toggle");
  if (!seconds || !window.fetch || !window.DOMParser) {
    return;
  }
  var key = "graphile-worker-dashboard-refresh";
  var paused = window.localStorage && localStorage.getItem(key) === "off";

  function show() {
    if (toggle) {
      toggle.querySelector("b").textContent = paused ? "off" : "on";
      toggle.classList.toggle("paused", paused);
    }
  }

  function busy() {
    var active = document.activeElement;
    return active && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName);
  }

  // An action's notice comes once (a one-time cookie), not with the
  // refreshed content: it stays until the page is left.
  function keepNotice(current, next) {
    var notice = current.querySelector("#notice");
    if (notice && !next.querySelector("#notice")) {
      next.insertBefore(notice, next.firstChild);
    }
  }

  function refresh() {
    if (paused || document.hidden || busy()) {
      return schedule();
    }
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (!response.ok) {
          throw new Error(String(response.status));
        }
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("content");
        var current = document.getElementById("content");
        if (fresh && current && !busy() && !paused) {
          var next = document.importNode(fresh, true);
          keepNotice(current, next);
          current.replaceWith(next);
        }
        document.body.classList.remove("stale");
      })
      .catch(function () {
        document.body.classList.add("stale");
      })
      .then(schedule);
  }

  var timer = null;
  function schedule() {
    window.clearTimeout(timer);
    timer = window.setTimeout(refresh, seconds * 1000);
  }

  if (toggle) {
    toggle.addEventListener("click", function () {
      paused = !paused;
      if (window.localStorage) {
        localStorage.setItem(key, paused ? "off" : "on");
      }
      show();
    });
  }
  show();
  schedule();
})();
