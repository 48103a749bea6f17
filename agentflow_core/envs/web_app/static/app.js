// AgentFlow storefront client: every click on a button or a navigation link, and every form submit,
// becomes one POST /api/act; the answer is the next page, swapped into the document in place.
"use strict";
(function () {
  let busy = Promise.resolve();

  function formFields(form) {
    const fields = {};
    new FormData(form).forEach((value, name) => { fields[name] = String(value); });
    return fields;
  }

  function pageFields() {
    const fields = {};
    document.querySelectorAll("form").forEach((form) => Object.assign(fields, formFields(form)));
    return fields;
  }

  async function act(action) {
    const response = await fetch("/api/act", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(action),
      credentials: "same-origin",
    });
    const page = await response.json();
    document.title = page.title;
    document.body.innerHTML = page.html;
    for (const [name, value] of Object.entries(page.attrs)) document.body.setAttribute(name, value);
    document.body.dataset.status = String(response.status);
    history.replaceState(null, "", page.url);
  }

  function queue(action) {
    busy = busy.then(() => act(action)).catch((error) => { document.body.dataset.clientError = String(error); });
  }

  document.addEventListener("click", (event) => {
    const element = event.target.closest("button[id], a[id]");
    if (!element) return;
    event.preventDefault();
    // A click carries the page's current form values (the card the user typed in), as a submit does.
    queue({ type: "click", target: "#" + element.id, fields: pageFields() });
  });

  document.addEventListener("submit", (event) => {
    event.preventDefault();
    const form = event.target;
    queue({ type: "submit", form: form.getAttribute("name"), fields: formFields(form) });
  });

  history.replaceState(null, "", document.body.dataset.url);
})();
