// Copy buttons of the caller portal, the only script it has (served from
// the portal itself, which its Content-Security-Policy allows). Without
// it the buttons stay hidden and the values stay selectable text.
"use strict";
(function () {
  function textOf(el) {
    return el.value !== undefined && el.tagName === "INPUT" ? el.value : el.textContent;
  }
  function fallback(el) {
    var r = document.createRange();
    if (el.tagName === "INPUT") {
      el.select();
    } else {
      r.selectNodeContents(el);
      var s = window.getSelection();
      s.removeAllRanges();
      s.addRange(r);
    }
    return document.execCommand("copy");
  }
  function done(b, ok) {
    var status = document.getElementById(b.getAttribute("data-copy") + "-status");
    if (status) {
      status.textContent = ok ? "Copied" : "Select the text and copy it";
    }
  }
  function init() {
    var buttons = document.querySelectorAll("button[data-copy]");
    for (var i = 0; i < buttons.length; i++) {
      (function (b) {
        var el = document.getElementById(b.getAttribute("data-copy"));
        if (!el) {
          return;
        }
        b.hidden = false;
        b.addEventListener("click", function () {
          var text = textOf(el);
          if (navigator.clipboard && window.isSecureContext) {
            navigator.clipboard.writeText(text).then(function () { done(b, true); }, function () { done(b, fallback(el)); });
          } else {
            done(b, fallback(el));
          }
        });
      })(buttons[i]);
    }
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
