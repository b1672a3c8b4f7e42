"""A `Report` rendered: Markdown for the run folder and a README, and one self-contained
HTML page with the plots inline as base64 PNG (to mail, or attach to an issue)."""

from __future__ import annotations

import base64
import html

from benchbatch.output.report.claims import FAILS, HOLDS, PARTLY, UNMEASURED, Claim
from benchbatch.output.report.shapes import Report

VERDICT_MARK = {HOLDS: "holds", PARTLY: "partly", FAILS: "does not hold", UNMEASURED: "-"}


def claim_rows(report: Report) -> list[list[str]]:
    return [[c.key, c.claim, c.article, c.measured, c.verdict_text, c.rule] for c in report.claims]


CLAIM_HEADERS = ["", "claim", "article", "this run", "verdict", "rule"]


def to_markdown(report: Report) -> str:
    lines = [f"# {report.title}", ""]
    lines += [f"**{n}**\n" for n in report.notices]
    lines += [f"- {k}: {v}" for k, v in report.facts] + [""]
    lines += ["## Verdicts", "", *_md_table(CLAIM_HEADERS, claim_rows(report)), ""]
    for s in report.sections:
        lines += [f"## {s.title}", ""]
        for paragraph in s.intro:
            lines += [paragraph, ""]
        lines += [*_md_table(s.headers, s.rows), ""]
        lines += [f"- {n}" for n in s.notes] + ([""] if s.notes else [])
        if s.image:
            lines += [f"![{s.title}]({s.image})", ""]
    if report.files:
        lines += ["## Files", "", *(f"- `{f}`" for f in report.files), ""]
    return "\n".join(lines)


def _md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    def cells(values) -> str:
        return "| " + " | ".join(str(v).replace("|", "\\|") for v in values) + " |"

    return [cells(headers), cells(["---"] * len(headers)), *(cells(r) for r in rows)]


CSS = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em;
       color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.92em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.notice { background: #fff4d6; border-left: 4px solid #e0a800; padding: 0.5em 0.8em; }
.v-holds { background: #dff3df; } .v-partly { background: #fff1cc; }
.v-fails { background: #f8d7d7; } .v-none { background: #eee; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
"""
VERDICT_CLASS = {HOLDS: "v-holds", PARTLY: "v-partly", FAILS: "v-fails", UNMEASURED: "v-none"}


def to_html(report: Report, images: dict[str, bytes]) -> str:
    """One self-contained page: `images` maps a section's PNG name to its bytes."""
    e = html.escape
    out = [
        "<!doctype html>",
        '<html><head><meta charset="utf-8">',
        f"<title>{e(report.title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{e(report.title)}</h1>",
    ]
    out += [f'<p class="notice"><strong>{e(n)}</strong></p>' for n in report.notices]
    out.append("<ul>" + "".join(f"<li>{e(k)}: {e(v)}</li>" for k, v in report.facts) + "</ul>")
    out += ["<h2>Verdicts</h2>", _html_claims(report.claims)]
    for s in report.sections:
        out.append(f"<h2>{e(s.title)}</h2>")
        out += [f"<p>{e(p)}</p>" for p in s.intro]
        out.append(_html_table(s.headers, s.rows))
        if s.notes:
            out.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in s.notes) + "</ul>")
        if s.image and s.image in images:
            data = base64.b64encode(images[s.image]).decode("ascii")
            out.append(f'<img alt="{e(s.title)}" src="data:image/png;base64,{data}">')
    if report.files:
        out += ["<h2>Files</h2>", "<ul>", *(f"<li><code>{e(f)}</code></li>" for f in report.files)]
        out.append("</ul>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _html_table(headers: list[str], rows: list[list[str]]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _html_claims(items: list[Claim]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in CLAIM_HEADERS)
    rows = []
    for c in items:
        cells = [c.key, c.claim, c.article, c.measured]
        tds = "".join(f"<td>{e(v)}</td>" for v in cells)
        caveat = f"<br>{e(c.caveat)}" if c.caveat else ""
        verdict = f"<strong>{e(c.verdict)}</strong>{caveat}"
        tds += f'<td class="{VERDICT_CLASS[c.verdict]}">{verdict}</td>'
        tds += f"<td>{e(c.rule)}</td>"
        rows.append(f"<tr>{tds}</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"
