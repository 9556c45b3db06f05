// Key/value rows: an "add a row" button that clones the last row (the form works without it:
// two empty rows are always there).
(function () {
  "use strict";
  for (const button of document.querySelectorAll("[data-add-row]")) {
    const prefix = button.dataset.addRow;
    const table = document.querySelector(`table[data-rows="${prefix}"] tbody`);
    const total = document.getElementById(`id_${prefix}-TOTAL_FORMS`);
    if (!table || !total) continue;
    button.hidden = false;
    button.addEventListener("click", () => {
      const rows = table.querySelectorAll("tr.pair");
      const row = rows[rows.length - 1].cloneNode(true);
      const index = Number(total.value);
      for (const input of row.querySelectorAll("input")) {
        input.name = input.name.replace(/-\d+-/, `-${index}-`);
        input.id = input.id.replace(/-\d+-/, `-${index}-`);
        input.value = "";
        input.classList.remove("has-error");
        input.setAttribute("aria-label", input.getAttribute("aria-label").replace(/\d+$/, String(index + 1)));
      }
      row.classList.remove("has-error");
      table.appendChild(row);
      total.value = String(index + 1);
      row.querySelector("input").focus();
    });
  }
})();
