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
    var info = document.getElementById("cell-info");
    var active = {};
    var legend = document.querySelectorAll("#grid-legend button[data-state]");
    var apply = function () {  // one class per shown state on the grid: one restyle
      var any = Object.keys(active).length > 0;
      grid.classList.toggle("dim", any);
      for (var j = 0; j < legend.length; j++) {
        var shown = legend[j].getAttribute("data-state");
        grid.classList.toggle("show-" + shown, active[shown] === true);
      }
      for (j = 0; j < legend.length; j++) {
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

  // Timeline: zoom (buttons, Ctrl + wheel, double-click) and pan (drag). Plot elements keep
  // their plot coordinate in data-x (data-w: a width, data-c: the offset of a mark's centre);
  // the view [v0, v1] of plot coordinates is drawn over [left, right].
  var tl = document.getElementById("tl");
  if (tl && tl.getAttribute("data-axis")) {
    var SVGNS = "http://www.w3.org/2000/svg";
    var left = parseFloat(tl.getAttribute("data-left"));
    var right = parseFloat(tl.getAttribute("data-right"));
    var bottom = parseFloat(tl.getAttribute("data-bottom"));
    var segs = JSON.parse(tl.getAttribute("data-axis"));
    var v0 = left, v1 = right;
    var els = Array.prototype.slice.call(tl.querySelectorAll(
      ".plot [data-x], .plot g.flag, .plot g.tk"));
    var orig = els.map(function (el) {  // a flag or tick group: the x of its line
      var x = el.hasAttribute("data-x") ? el.getAttribute("data-x") :
        el.querySelector("line").getAttribute("x1");
      return [parseFloat(x), el.hasAttribute("data-w") ?
        parseFloat(el.getAttribute("data-w")) : null, parseFloat(el.getAttribute("data-c") || "0")];
    });
    var plot = tl.querySelector(".plot");
    var ticks = tl.querySelector(".ticks");
    var zt = document.createElementNS(SVGNS, "g");
    zt.setAttribute("class", "zticks");
    plot.appendChild(zt);
    var rangeText = document.getElementById("tl-range");
    var S = function (x) { return left + (x - v0) * (right - left) / (v1 - v0); };
    var Sinv = function (px) { return v0 + (px - left) * (v1 - v0) / (right - left); };
    var timeAt = function (x) {  // ms from the first moment, or null inside a cut gap
      for (var i = 0; i < segs.length; i++) {
        var s = segs[i];
        if (x <= s[1] || i === segs.length - 1) {
          if (s[4]) { return null; }
          var f = s[1] > s[0] ? Math.min(1, Math.max(0, (x - s[0]) / (s[1] - s[0]))) : 0.5;
          return s[2] + f * (s[3] - s[2]);
        }
      }
      return null;
    };
    var fmt = function (ms, step) {
      var unit = "ms", scale = 1;
      if (ms >= 7200000) { unit = "h"; scale = 1 / 3600000; } else if (ms >= 120000) {
        unit = "min"; scale = 1 / 60000; } else if (ms >= 1000) { unit = "s"; scale = 1 / 1000; }
      var st = Math.max(step * scale, 1e-9);
      var d = st < 1 ? Math.min(6, Math.max(0, -Math.floor(Math.log(st) / Math.LN10))) : 0;
      return "+" + (ms * scale).toFixed(d) + " " + unit;
    };
    var drawTicks = function () {
      while (zt.firstChild) { zt.removeChild(zt.firstChild); }
      var zoomed = v0 > left + 1e-6 || v1 < right - 1e-6;
      ticks.style.display = zoomed ? "none" : "";
      if (!zoomed) { return; }
      var n = 6, lastEnd = -1e9, prev = null;
      for (var i = 0; i <= n; i++) {
        var px = left + (right - left) * i / n;
        var t = timeAt(Sinv(px));
        var t2 = timeAt(Sinv(px + (right - left) / n));
        if (t === null) { continue; }
        var label = fmt(t, Math.abs((t2 === null ? t : t2) - t) || 1);
        if (label === prev) { continue; }
        var w = label.length * 6.2;
        var anchor = i === 0 ? "start" : i === n ? "end" : "middle";
        var lo = anchor === "start" ? px : anchor === "end" ? px - w : px - w / 2;
        if (lo < lastEnd + 8) { continue; }
        var line = document.createElementNS(SVGNS, "line");
        line.setAttribute("x1", px); line.setAttribute("x2", px);
        line.setAttribute("y1", bottom); line.setAttribute("y2", bottom + 4);
        var text = document.createElementNS(SVGNS, "text");
        text.setAttribute("x", px); text.setAttribute("y", bottom + 16);
        text.setAttribute("text-anchor", anchor);
        text.textContent = label;
        zt.appendChild(line); zt.appendChild(text);
        lastEnd = lo + w; prev = label;
      }
    };
    var draw = function () {
      for (var i = 0; i < els.length; i++) {
        var el = els[i], o = orig[i];
        if (o[1] !== null) {
          var a = S(o[0]), b = S(o[0] + o[1]);
          el.setAttribute("x", a.toFixed(2)); el.setAttribute("width", Math.max(0, b - a).toFixed(2));
        } else if (el.tagName.toLowerCase() === "g") {
          el.setAttribute("transform", "translate(" + (S(o[0]) - o[0]).toFixed(2) + ",0)");
        } else {
          el.setAttribute("x", (S(o[0] + o[2]) - o[2]).toFixed(2));
        }
      }
      drawTicks();
      var k = (right - left) / (v1 - v0);
      tl.setAttribute("data-zoom", k.toFixed(3));
      if (rangeText) {
        rangeText.textContent = k > 1.001 ? "zoom ×" + (k < 10 ? k.toFixed(1) : Math.round(k)) +
          "; drag to pan" : "drag to pan; Ctrl + wheel or double-click to zoom";
      }
    };
    var MAXK = 400;
    var setView = function (a, b) {
      var w = Math.max(b - a, (right - left) / MAXK);
      if (w >= right - left) { v0 = left; v1 = right; draw(); return; }
      if (a < left) { a = left; }
      if (a + w > right) { a = right - w; }
      v0 = a; v1 = a + w;
      draw();
    };
    var zoomAt = function (factor, px) {  // factor > 1 zooms in around screen x px
      var c = Sinv(px), w = (v1 - v0) / factor;
      setView(c - (px - left) / (right - left) * w, c - (px - left) / (right - left) * w + w);
    };
    // Screen pixels -> SVG units (the SVG scales with its box).
    var toSvgX = function (clientX) {
      var r = tl.getBoundingClientRect();
      return (clientX - r.left) * tl.viewBox.baseVal.width / r.width;
    };
    var inPlot = function (x) { return x >= left && x <= right; };
    document.getElementById("tl-tools").hidden = false;
    tl.classList.add("zoomable");
    var btns = document.querySelectorAll("#tl-tools button[data-zoom]");
    for (var bi = 0; bi < btns.length; bi++) {
      btns[bi].addEventListener("click", function (ev) {
        var f = parseFloat(ev.currentTarget.getAttribute("data-zoom"));
        if (f === 0) { setView(left, right); } else { zoomAt(f, (left + right) / 2); }
      });
    }
    tl.addEventListener("wheel", function (ev) {
      var x = toSvgX(ev.clientX);
      if (!ev.ctrlKey || !inPlot(x)) { return; }
      ev.preventDefault();
      zoomAt(ev.deltaY < 0 ? 1.25 : 0.8, x);
    }, { passive: false });
    tl.addEventListener("dblclick", function (ev) {
      var x = toSvgX(ev.clientX);
      if (inPlot(x)) { ev.preventDefault(); zoomAt(ev.shiftKey ? 0.5 : 2, x); }
    });
    var drag = null;
    tl.addEventListener("pointerdown", function (ev) {
      var x = toSvgX(ev.clientX);
      if (!inPlot(x) || ev.button !== 0) { return; }
      drag = { x: x, v0: v0, v1: v1, moved: false };
    });
    window.addEventListener("pointermove", function (ev) {
      if (!drag) { return; }
      var dx = (toSvgX(ev.clientX) - drag.x) * (drag.v1 - drag.v0) / (right - left);
      if (Math.abs(dx) > 0.5 && !drag.moved) { drag.moved = true; tl.classList.add("dragging"); }
      if (drag.moved) { setView(drag.v0 - dx, drag.v1 - dx); }
    });
    window.addEventListener("pointerup", function () {
      drag = null; tl.classList.remove("dragging");
    });
    // Paper shows the whole span.
    window.addEventListener("beforeprint", function () { setView(left, right); });
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
