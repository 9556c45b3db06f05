// The new-key card's Copy button: hidden without JavaScript (the secret is selectable there).
// The Clipboard API needs a secure context (https or localhost); elsewhere fall back to
// selecting the text and the older copy command.
(function () {
  "use strict";
  const button = document.getElementById("copy-key");
  const status = document.getElementById("copy-status");
  if (!button) return;
  const source = document.getElementById(button.dataset.copy);
  button.hidden = false;

  function selectSecret() {
    const range = document.createRange();
    range.selectNodeContents(source);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }

  function done(ok) {
    status.textContent = ok ? "Copied." : "Press Ctrl+C (⌘C) to copy the selected key.";
    if (ok) button.textContent = "Copied";
  }

  button.addEventListener("click", function () {
    const text = source.textContent.trim();
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(
        function () { done(true); },
        function () { selectSecret(); done(false); }
      );
      return;
    }
    selectSecret();
    let ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    done(ok);
  });
})();
