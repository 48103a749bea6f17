"""The evaluation report rendered as Markdown (plots linked) and as one standalone HTML page (plots embedded).

Both renderings show the same parts of the document :func:`~agentflow_core.evaluation.report.build_report`
assembles, in the same order: the cycle's opening and headline tables, the report tree, the plots,
the section tables, the champion decision and the recommendations. Rendering is pure: file I/O
stays at the edge.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping
from typing import Any

from agentflow_core.evaluation.report import headline_tables, opening_lines, report_tree, section_tables, tree_text


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def render_markdown(report: Mapping[str, Any]) -> str:
    """Markdown with the tree in a code block, the tables, and the plots linked by file name."""
    lines = []
    opening = opening_lines(report)
    if opening:
        cycle = report["cycle"]
        lines += [f"# {cycle['verdict'].upper()}: {report['policy']}", "", *[f"- {line}" for line in opening], ""]
        train_plot = (cycle.get("training") or {}).get("plot")
        if train_plot:
            lines += [f"![training curve]({train_plot})", ""]
        for title, headers, rows in headline_tables(report):
            lines += [f"## {title}", "", *(_table(headers, rows) if rows else ["none"]), ""]
    lines += [
        f"# Evaluation report: {report['policy']}",
        "",
        f"Created {report['created_at']} from checkpoint `{report['checkpoint']}`; "
        f"phase {'passed' if report['passed'] else 'did not pass'}.",
        "",
        "```",
        *tree_text(report_tree(report)),
        "```",
        "",
    ]
    for name, file in report["plots"].items():
        lines += [f"![{name}]({file})", ""]
    for title, headers, rows in section_tables(report):
        if rows:
            lines += [f"## {title}", "", *_table(headers, rows), ""]
    if report.get("champion"):
        lines += ["## Champion / challenger", "", report["champion"]["reason"], ""]
    lines += ["## Recommendations", "", *[f"- {r}" for r in report["recommendations"]], ""]
    return "\n".join(lines)


def render_html(report: Mapping[str, Any], images: Mapping[str, bytes]) -> str:
    """A standalone HTML page: the tree, the tables and the plots as base64 PNGs."""
    esc = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>Evaluation report: {esc(report['policy'])}</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:1.5em}"
        "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}pre{background:#f6f6f6;padding:1em}</style>",
        "</head><body>",
    ]
    opening = opening_lines(report)
    if opening:
        cycle = report["cycle"]
        parts.append(f"<h1>{esc(cycle['verdict'].upper())}: {esc(report['policy'])}</h1><ul>")
        parts += [f"<li>{esc(line)}</li>" for line in opening]
        parts.append("</ul>")
        if "training curve" in images:
            parts.append(_img("training curve", images["training curve"]))
        for title, headers, rows in headline_tables(report):
            parts.append(_html_table(title, headers, rows) if rows else f"<h2>{esc(title)}</h2><p>none</p>")
    parts += [
        f"<h1>Evaluation report: {esc(report['policy'])}</h1>",
        f"<pre>{esc(chr(10).join(tree_text(report_tree(report))))}</pre>",
    ]
    for name, data in images.items():
        if name != "training curve":
            parts.append(_img(name, data))
    for title, headers, rows in section_tables(report):
        if rows:
            parts.append(_html_table(title, headers, rows))
    parts.append(
        "<h2>Recommendations</h2><ul>" + "".join(f"<li>{esc(r)}</li>" for r in report["recommendations"]) + "</ul>"
    )
    parts.append("</body></html>")
    return "\n".join(parts)


def _img(name: str, data: bytes) -> str:
    esc = html.escape
    return (
        f"<h2>{esc(name)}</h2><img alt='{esc(name)}' style='max-width:100%' "
        f"src='data:image/png;base64,{base64.b64encode(data).decode('ascii')}'>"
    )


def _html_table(title: str, headers: list[str], rows: list[list[Any]]) -> str:
    esc = html.escape
    head = f"<h2>{esc(title)}</h2><table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr>"
    body = ["<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in row) + "</tr>" for row in rows]
    return "\n".join([head, *body, "</table>"])
