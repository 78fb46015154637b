(function () {
  "use strict";
  var root = document.documentElement;

  // Theme: auto (follows the system) -> light -> dark.
  var themeBtn = document.getElementById("theme");
  var themes = ["auto", "light", "dark"];
  function setTheme(t) {
    if (t === "auto") { root.removeAttribute("data-theme"); } else { root.setAttribute("data-theme", t); }
    if (themeBtn) { themeBtn.textContent = "theme: " + t; }
    try { localStorage.setItem("ddp-autopsy-theme", t); } catch (e) { /* file:// may forbid it */ }
  }
  var saved = "auto";
  try { saved = localStorage.getItem("ddp-autopsy-theme") || "auto"; } catch (e) { saved = "auto"; }
  if (themes.indexOf(saved) < 0) { saved = "auto"; }
  if (themeBtn) {
    themeBtn.hidden = false;
    setTheme(saved);
    themeBtn.addEventListener("click", function () {
      var cur = root.getAttribute("data-theme") || "auto";
      setTheme(themes[(themes.indexOf(cur) + 1) % themes.length]);
    });
  }

  // Rank grid: filter by state, find a rank, show a cell's details.
  var grid = document.getElementById("grid");
  if (grid) {
    var cells = grid.getElementsByTagName("i");
    var info = document.getElementById("cell-info");
    var active = {};
    var legend = document.querySelectorAll("#grid-legend button[data-state]");
    var apply = function () {
      var any = Object.keys(active).length > 0;
      grid.classList.toggle("dim", any);
      for (var i = 0; i < cells.length; i++) {
        var c = cells[i];
        c.classList.toggle("on", any && active[c.className.split(" ")[0]] === true);
      }
      for (var j = 0; j < legend.length; j++) {
        var st = legend[j].getAttribute("data-state");
        legend[j].parentNode.classList.toggle("off", any && !active[st]);
        legend[j].setAttribute("aria-pressed", active[st] ? "true" : "false");
      }
    };
    for (var k = 0; k < legend.length; k++) {
      legend[k].addEventListener("click", function (ev) {
        var st = ev.currentTarget.getAttribute("data-state");
        if (active[st]) { delete active[st]; } else { active[st] = true; }
        apply();
      });
    }
    grid.addEventListener("click", function (ev) {
      var t = ev.target;
      if (t && t.tagName === "I" && info) { info.textContent = t.getAttribute("title") || ""; }
    });
    var find = document.getElementById("rank-find");
    if (find) {
      document.getElementById("grid-tools").hidden = false;
      find.addEventListener("input", function () {
        var want = find.value.trim();
        var prev = grid.querySelector("i.found");
        if (prev) { prev.classList.remove("found"); }
        var hit = want !== "" ? document.getElementById("r" + want) : null;
        if (hit) { hit.classList.add("found"); }
        if (info) { info.textContent = hit ? hit.getAttribute("title") : (want ? "rank " + want + " is not in the grid" : ""); }
        if (hit && hit.scrollIntoView) { hit.scrollIntoView({ block: "nearest" }); }
      });
    }
  }

  // Rank table: sort by a column (click its heading), filter rows by any text.
  var rt = document.getElementById("rank-table");
  if (rt) {
    var body = rt.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var heads = rt.tHead.rows[0].cells;
    var keyOf = function (row, col, numeric) {
      var cell = row.cells[col];
      if (numeric) { return parseFloat(cell.getAttribute("data-v") || cell.textContent) || 0; }
      return cell.textContent.toLowerCase();
    };
    var sortBy = function (col) {
      var th = heads[col];
      var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
      var numeric = th.getAttribute("data-sort") === "n";
      for (var h = 0; h < heads.length; h++) { heads[h].removeAttribute("aria-sort"); }
      th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
      var keyed = rows.map(function (r, i) { return [keyOf(r, col, numeric), i, r]; });
      keyed.sort(function (a, b) {
        return a[0] < b[0] ? -dir : a[0] > b[0] ? dir : a[1] - b[1];
      });
      var frag = document.createDocumentFragment();
      for (var k2 = 0; k2 < keyed.length; k2++) { frag.appendChild(keyed[k2][2]); }
      body.appendChild(frag);
    };
    for (var h = 0; h < heads.length; h++) {
      if (heads[h].hasAttribute("data-sort")) {
        heads[h].tabIndex = 0;
        heads[h].addEventListener("click", sortBy.bind(null, h));
        heads[h].addEventListener("keydown", function (col, ev) {
          if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); sortBy(col); }
        }.bind(null, h));
      }
    }
    var texts = rows.map(function (r) { return r.textContent.toLowerCase(); });
    var filter = document.getElementById("rank-filter");
    var count = document.getElementById("rank-count");
    document.getElementById("rank-tools").hidden = false;
    filter.addEventListener("input", function () {
      var want = filter.value.trim().toLowerCase();
      var shown = 0;
      for (var r = 0; r < rows.length; r++) {
        var hit = want === "" || texts[r].indexOf(want) >= 0 ||
          rows[r].cells[0].getAttribute("data-v") === want;
        rows[r].hidden = !hit;
        if (hit) { shown++; }
      }
      count.textContent = want === "" ? "" : shown + " of " + rows.length + " rows";
    });
  }

  // Stack trees: expand or fold every branch.
  var toggles = document.querySelectorAll("button[data-tree]");
  for (var i = 0; i < toggles.length; i++) {
    toggles[i].hidden = false;
    toggles[i].addEventListener("click", function (ev) {
      var btn = ev.currentTarget;
      var box = document.getElementById(btn.getAttribute("data-tree"));
      var open = btn.getAttribute("data-open") === "1";
      var ds = box ? box.querySelectorAll("details") : [];
      for (var j = 0; j < ds.length; j++) { ds[j].open = open; }
    });
  }

  // Printing: open every folded part, restore afterwards.
  var reopened = [];
  window.addEventListener("beforeprint", function () {
    var ds = document.querySelectorAll("details:not([open]):not(.no-print):not(.stay-folded)");
    for (var i = 0; i < ds.length; i++) { ds[i].open = true; reopened.push(ds[i]); }
  });
  window.addEventListener("afterprint", function () {
    for (var i = 0; i < reopened.length; i++) { reopened[i].open = false; }
    reopened = [];
  });
})();
