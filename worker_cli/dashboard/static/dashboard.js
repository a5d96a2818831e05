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

  // A form being filled in (class keep-draft: a field changed from what the
  // page gave it) is not wiped by a refresh.
  function drafting() {
    var fields = document.querySelectorAll(
      "form.keep-draft input:not([type=hidden]), form.keep-draft select"
    );
    for (var i = 0; i < fields.length; i++) {
      var field = fields[i];
      if (field.tagName === "SELECT") {
        for (var j = 0; j < field.options.length; j++) {
          if (field.options[j].selected !== field.options[j].defaultSelected) {
            return true;
          }
        }
      } else if (field.type === "checkbox" ? field.checked !== field.defaultChecked
          : field.value !== field.defaultValue) {
        return true;
      }
    }
    return false;
  }

  function busy() {
    var active = document.activeElement;
    return (active && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName)) || drafting();
  }

  // A <details> with an id (the pause form, a job's log) stays open or
  // closed in the refreshed content as it was left.
  function keepOpen(current, next) {
    var boxes = current.querySelectorAll("details[id]");
    for (var i = 0; i < boxes.length; i++) {
      var same = next.querySelector("#" + boxes[i].id);
      if (same) {
        same.open = boxes[i].open;
      }
    }
  }

  // An action's notice comes once (a one-time cookie), not with the
  // refreshed content: it stays until the page is left.
  function keepNotice(current, next) {
    var notice = current.querySelector("#notice");
    if (notice && !next.querySelector("#notice")) {
      next.insertBefore(notice, next.firstChild);
    }
  }

  // A box that scrolls inside the page (class keep-scroll: a workflow's
  // graph) stays where it was scrolled to in the refreshed content.
  function scrolled(current) {
    var boxes = current.querySelectorAll(".keep-scroll[id]");
    var found = [];
    for (var i = 0; i < boxes.length; i++) {
      found.push([boxes[i].id, boxes[i].scrollTop, boxes[i].scrollLeft]);
    }
    return found;
  }

  function keepScroll(found) {
    for (var i = 0; i < found.length; i++) {
      var box = document.getElementById(found[i][0]);
      if (box) {
        box.scrollTop = found[i][1];
        box.scrollLeft = found[i][2];
      }
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
          keepOpen(current, next);
          var positions = scrolled(current);
          current.replaceWith(next);
          keepScroll(positions);
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

// A limit's "Change…" button fills the limit form with that limit and opens
// it (whether or not the page refreshes itself; the content may have been
// replaced since the page loaded, hence one listener on the document).
(function () {
  var fields = {
    "limit-kind": "kind",
    "limit-name": "name",
    "limit-max-running": "maxRunning",
    "limit-max-starts": "maxStarts",
    "limit-per": "per",
    "limit-partition": "partitionBy"
  };
  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest(".limit-change") : null;
    var details = document.getElementById("limit-details");
    if (!button || !details) {
      return;
    }
    for (var id in fields) {
      var field = document.getElementById(id);
      if (field) {
        field.value = button.dataset[fields[id]] || "";
      }
    }
    details.open = true;
    document.getElementById("limit-max-running").focus();
  });
})();
