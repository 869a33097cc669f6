// The operator console's only script: the copy button of a new key.
// Everything else works without JavaScript.
"use strict";
document.addEventListener("click", function (ev) {
  var b = ev.target.closest("button[data-copy]");
  if (!b) { return; }
  var el = document.getElementById(b.getAttribute("data-copy"));
  if (!el || !navigator.clipboard) { return; }
  navigator.clipboard.writeText(el.textContent).then(function () {
    b.textContent = "Copied";
  });
});
