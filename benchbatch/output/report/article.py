"""The article's own numbers, as its tables print them: measured on an RTX 5080 in fp16 with
torch 2.8 (its "12 layers, hidden 2048" model: 77.6 TFLOP/s x 0.664 ms / 512 tokens is
2 x 12 x 2048^2 FLOPs a token, so twelve 2048 x 2048 linear layers); table C is a simulation
of 600 requests on 32 slots."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArticleStep:
    """One row of the article's table B."""

    phase: str  # prefill or decode
    size: int  # prompt tokens (prefill) or sequences (decode)
    step_ms: float
    us_per_token: float
    tflops: float

    @property
    def label(self) -> str:
        return f"prefill {self.size}" if self.phase == "prefill" else f"decode b={self.size}"


ARTICLE_B = (
    ArticleStep("prefill", 512, 0.664, 1.3, 77.6),
    ArticleStep("prefill", 2048, 1.955, 1.0, 105.5),
    ArticleStep("decode", 1, 0.319, 318.9, 0.3),
    ArticleStep("decode", 32, 0.257, 8.0, 12.6),
)
# Table A: batch -> (step ms, tokens/s), decode at context 512.
ARTICLE_A = {
    1: (0.321, 3120.0),
    8: (0.243, 32971.0),
    32: (0.246, 130006.0),
    128: (0.228, 561933.0),
    256: (0.368, 696195.0),
}
# Experiment C: policy -> (total steps, slot occupancy); 600 requests, 32 slots.
ARTICLE_C = {"static": (9602, 0.203), "continuous": (2445, 0.799)}
ARTICLE_C_SPEEDUP = 3.93
ARTICLE_C_WORKLOAD = "600 requests (output median 70, max 1,327 tokens), 32 slots, all queued"
