"""The storefront's pages as HTML: one element per part of :class:`~agentflow_core.envs.web_pages.PageParts`.

Layout (what the browser channel's DOM reader relies on): ``<header>`` holds the status lines
(``p.status``) and the navigation links (``nav a[id]``); ``<main>`` the title (``h1``), the lead text
(``p.lead``), the flash banner (``[role=alert]`` with ``data-kind``), the forms (``form[name]`` with
their ``input[name]``) and the buttons (``.actions button[id]``). Numbers the page's scripts use sit
in ``data-*`` attributes of ``<body>``. Everything user-visible is escaped.
"""

from __future__ import annotations

from html import escape
from typing import Any

from agentflow_core.envs.web_pages import PageParts

SCRIPT_PATH = "/static/app.js"


def _label(element_id: str) -> str:
    return element_id.lstrip("#").replace("-", " ").capitalize()


def _attr_name(key: str) -> str:
    return "data-" + key.replace("_", "-")


def body_attrs(parts: PageParts, cart_count: int, balance: float, sim_time_s: float, seq: int) -> dict[str, str]:
    """``<body>`` attributes: page name, URL, request sequence number and the page's numbers (``repr``: exact)."""
    values: dict[str, Any] = {"cart_count": cart_count, "balance": balance, "sim_time_s": sim_time_s, **parts.data}
    return {
        "data-page": parts.page,
        "data-url": parts.url,
        "data-seq": str(seq),
        "data-values": ",".join(values),
        **{_attr_name(k): repr(v) for k, v in values.items()},
    }


def body_html(parts: PageParts) -> str:
    """The inner HTML of ``<body>`` for one page."""
    status = "".join(f'<p class="status">{escape(line)}</p>' for line in parts.header)
    nav = "".join(f'<a id="{escape(i[1:])}" href="#">{escape(_label(i))}</a>' for i in parts.links)
    banner = ""
    if parts.banner is not None:
        kind, text = escape(parts.banner.get("kind", "")), escape(parts.banner.get("text", ""))
        banner = f'<div role="alert" class="banner" data-kind="{kind}">{text}</div>'
    forms = []
    for index, name in enumerate(parts.forms):
        inputs = (
            "".join(
                f'<label>{escape(field)} <input name="{escape(field)}" value="{escape(value)}"></label>'
                for field, value in parts.fields.items()
            )
            if index == 0
            else ""
        )
        forms.append(f'<form name="{escape(name)}">{inputs}</form>')
    buttons = "".join(f'<button id="{escape(i[1:])}" type="button">{escape(_label(i))}</button>' for i in parts.buttons)
    return (
        f"<header>{status}<nav>{nav}</nav></header>"
        f'<main><h1>{escape(parts.title)}</h1><p class="lead">{escape(parts.body)}</p>{banner}'
        f'{"".join(forms)}<div class="actions">{buttons}</div></main>'
    )


def document_html(parts: PageParts, attrs: dict[str, str]) -> str:
    """A whole page: the document a navigation loads (later pages are swapped in by the script)."""
    body_attributes = " ".join(f'{name}="{escape(value)}"' for name, value in attrs.items())
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<title>{escape(parts.title)}</title><link rel="icon" href="data:,">'
        f'<script src="{SCRIPT_PATH}" defer></script></head>'
        f"<body {body_attributes}>{body_html(parts)}</body></html>"
    )


def no_session_html() -> str:
    """What a browser without a session cookie sees."""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>No session</title>'
        '<link rel="icon" href="data:,"></head><body data-page="no_session" data-url="/app">'
        "<main><h1>No session</h1></main></body></html>"
    )
