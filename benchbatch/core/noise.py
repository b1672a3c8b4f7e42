"""The one noise rule: when a timing is too spread to trust (no torch here).

Every table flags its rows by these thresholds, and every warning and verdict quotes them.
"""

from __future__ import annotations

# Repeats of one step: a coefficient of variation (stdev / mean) above 10% makes the median
# hard to trust.
DEFAULT_CV_THRESHOLD = 0.10

# A run's steps of one kind barely differ: p90 over twice the median means another process
# took the device meanwhile (the real engine's steps, against their median or a cost model).
NOISY_P90_OVER_MEDIAN = 2.0
