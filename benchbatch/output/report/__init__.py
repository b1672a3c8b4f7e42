"""The reproduction report: each measurement beside the article's number, and a verdict on
each claim computed from the measured numbers against thresholds stated in the report.

Pure: rows and summaries (as the CSV files and metadata.json hold them) go in, a `Report`
comes out (`sections.build`), and `to_markdown` / `to_html` render it. Nothing here
measures, prints or writes. The parts: `article` (the article's numbers), `claims` (the
verdicts and their rules), `sections` (each table beside this run's rows, and `build`),
`beyond` (the sections beyond the article's tables), `shapes` (Report and Section), `pages`
(Markdown and HTML), `cells` (one table cell from a CSV row).
"""

from benchbatch.output.report.article import (
    ARTICLE_A,
    ARTICLE_B,
    ARTICLE_C,
    ARTICLE_C_SPEEDUP,
    ArticleStep,
)
from benchbatch.output.report.beyond import (
    MEMORY_TITLE,
    PREDICTION_TITLE,
    SERVE_TITLE,
    section_prediction,
    section_roofline,
    section_serve,
)
from benchbatch.output.report.beyond_claims import prediction_claim, serve_claim
from benchbatch.output.report.claims import (
    BATCHING_FRACTION,
    BATCHING_MIN_HOLDS,
    BATCHING_MIN_PARTLY,
    BATCHING_RULE_TEXT,
    FAILS,
    HOLDS,
    LATENCY_HOLDS,
    LATENCY_RULE_TEXT,
    MEMORY_RULE_TEXT,
    PAGING_GAIN,
    PARTLY,
    PREFILL_RULE,
    SPEEDUP_RULE,
    THROUGHPUT_OVER_LATENCY,
    UNEVEN_STEPS,
    UNMEASURED,
    Claim,
    Rule,
    batching_verdict,
    claims,
    latency_verdict,
    memory_verdict,
)
from benchbatch.output.report.pages import VERDICT_CLASS, to_html, to_markdown
from benchbatch.output.report.sections import (
    REAL_TITLE,
    build,
    decode_context,
    pair_sizes,
    sweep_context,
    table_a,
    table_b,
    table_c,
)
from benchbatch.output.report.shapes import Report, Section

__all__ = [
    "ARTICLE_A", "ARTICLE_B", "ARTICLE_C", "ARTICLE_C_SPEEDUP", "ArticleStep",
    "BATCHING_FRACTION", "BATCHING_MIN_HOLDS", "BATCHING_MIN_PARTLY", "BATCHING_RULE_TEXT",
    "FAILS", "HOLDS", "LATENCY_HOLDS", "LATENCY_RULE_TEXT", "MEMORY_RULE_TEXT", "PAGING_GAIN",
    "PARTLY", "PREFILL_RULE", "SPEEDUP_RULE", "THROUGHPUT_OVER_LATENCY", "UNEVEN_STEPS",
    "UNMEASURED", "Claim", "Rule", "batching_verdict", "claims", "latency_verdict",
    "memory_verdict", "prediction_claim", "serve_claim", "VERDICT_CLASS", "to_html",
    "to_markdown", "MEMORY_TITLE", "PREDICTION_TITLE", "REAL_TITLE", "SERVE_TITLE", "Report",
    "Section", "build", "decode_context", "pair_sizes", "section_prediction", "section_roofline",
    "section_serve", "sweep_context", "table_a", "table_b", "table_c",
]  # fmt: skip
