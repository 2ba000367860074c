// The console's only script of its own (no inline script anywhere: the Content-Security-Policy forbids it).
// "Select all" ticks every record of the page; it also works after htmx swaps the table in.
document.addEventListener("change", function (event) {
  var box = event.target;
  if (!box.classList || !box.classList.contains("select-all")) {
    return;
  }
  var table = box.closest("table");
  table.querySelectorAll('input[name="failure_id"]').forEach(function (one) {
    one.checked = box.checked;
  });
});
