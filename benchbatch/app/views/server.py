"""serve in the terminal, once the server has stopped: where it listened, what it served,
and how its requests ended."""

from __future__ import annotations

from benchbatch.output import render

SUMMARY_COLUMNS = {
    "requests": "requests",
    "finished": "finished",
    "cancelled": "cancelled",
    "aborted": "aborted",
    "output_tokens": "output tokens",
    "steps": "steps",
    "busy_s": "busy s",
}


def document(rec) -> dict:
    return {
        "server": rec.meta.get("server", {}),
        "summary": rec.meta.get("summary", {}),
        "requests": rec.rows("requests"),
    }


def show(rec) -> None:
    server, summary = rec.meta.get("server", {}), rec.meta.get("summary", {})
    if server.get("url"):
        render.out_console.print(
            f"served {server.get('served_model_name')} ({server.get('policy')}, "
            f"{server.get('slots')} slots, max model length {server.get('max_model_len'):,}) at "
            f"{server['url']}; stopped by {server.get('stopped_by')}",
            highlight=False,
        )
    if summary:
        render.table([summary], SUMMARY_COLUMNS, "requests served")
    render.results_line(rec)
