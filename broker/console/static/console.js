// Fluvial console: page refresh and the row browser's live tail. No libraries.
"use strict";

function replaceFrom(url, selector) {
  return fetch(url, {headers: {"X-Requested-With": "console"}})
    .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
    .then(function (html) {
      var fresh = new DOMParser().parseFromString(html, "text/html").querySelector(selector);
      var old = document.querySelector(selector);
      if (fresh && old) { old.replaceWith(fresh); }
    })
    .catch(function () { /* the next round tries again */ });
}

function startAutoRefresh() {
  var box = document.getElementById("auto-refresh");
  if (!box) { return; }
  box.checked = localStorage.getItem("fluvial.autoRefresh") !== "off";
  box.addEventListener("change", function () {
    localStorage.setItem("fluvial.autoRefresh", box.checked ? "on" : "off");
  });
  setInterval(function () {
    if (box.checked && document.visibilityState === "visible") {
      replaceFrom(location.href, "main#content");
    }
  }, 5000);
}

function startLiveTail() {
  var live = document.getElementById("live");
  var form = document.getElementById("row-form");
  if (!live || !form) { return; }
  setInterval(function () {
    if (!live.checked) { return; }
    var params = new URLSearchParams(new FormData(form));
    params.set("fragment", "1");
    replaceFrom(location.pathname + "?" + params.toString(), "#rows");
  }, 2000);
}

document.addEventListener("DOMContentLoaded", function () {
  startAutoRefresh();
  startLiveTail();
});
