// The /memories/ change lists: keep "Delete selected (N)" in step with the checkboxes, and run the
// delete action (which shows a confirmation page first) when it is pressed.
"use strict";
(function () {
  function ready(fn) {
    if (document.readyState !== "loading") { fn(); } else { document.addEventListener("DOMContentLoaded", fn); }
  }
  ready(function () {
    var form = document.getElementById("changelist-form");
    var button = document.getElementById("delete-selected");
    if (!form || !button) { return; }
    var counter = button.querySelector(".count");
    var across = form.querySelector("input[name=select_across]");

    function selected() {
      if (across && across.value === "1") { return parseInt(button.dataset.total, 10); }
      return form.querySelectorAll("input.action-select:checked").length;
    }
    function update() {
      var n = selected();
      counter.textContent = String(n);
      button.disabled = n === 0;
    }
    form.addEventListener("change", update);
    // Django's "Select all N" / "Clear selection" links change select_across without a change event.
    form.addEventListener("click", function () { window.setTimeout(update, 0); });
    button.addEventListener("click", function () {
      var select = form.querySelector("select[name=action]");
      if (!select) { return; }
      select.value = button.dataset.action;
      var go = form.querySelector(".actions button[type=submit]");
      if (go) { go.click(); } else { form.submit(); }
    });
    update();
  });
})();
