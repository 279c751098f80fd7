"""How sure a canary step is: an interval around each check's figure, and what it allows.

The gate judges with bootstrap intervals; a canary step judges the same way. Each check's figure
gets an interval at `canary.confidence`, and the check:
- fails once the interval lies wholly above its threshold;
- holds once it lies wholly below;
- is undecided otherwise, and the step keeps collecting requests.

A share of requests (error rate, disagreement) gets a Wilson score interval: a fair coverage at
small counts and rates near 0, where the normal approximation says [0, 0] after zero errors. A
latency percentile gets its distribution-free interval from order statistics: the ranks the
binomial allows for the percentile. Score distance gets the Kolmogorov-Smirnov statistic plus or
minus both samples' Dvoretzky-Kiefer-Wolfowitz bands, which bound how far each empirical CDF lies
from its model's true one. scipy is imported inside, in the triggerer's thread, never at parse time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal

Outcome = Literal["fails", "holds", "undecided"]

NEEDED_CAP = 10_000_000  # requests: beyond this a check is reported as never deciding


@dataclass(frozen=True)
class CheckDecision:
    """One check of one step: its figure, the interval it decided on, and the decision."""

    check: str
    """`error_rate`, `latency_p99_ms`, `disagreement` or `score_distance`."""
    value: float
    low: float | None
    """None: no bound (too few requests for the percentile's lower rank; never for a share)."""
    high: float | None
    """None: no bound (too few requests to bound the percentile from above)."""
    threshold: float
    outcome: Outcome
    count: int
    """What the interval is over: requests, compared rows, or scores of each model."""
    unit: str = "requests"

    def describe(self) -> str:
        interval = f"[{_figure(self.low)}, {_figure(self.high)}]"
        relation = {"fails": ">", "holds": "<", "undecided": "around"}[self.outcome]
        text = f"{self.check} {self.value:.4g} {interval} {relation} {self.threshold:g}"
        if self.outcome == "undecided":
            return f"{text}: undecided at {self.count} {self.unit}"
        return f"{text} ({self.count} {self.unit})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "value": round(self.value, 6),
            "interval": [_rounded(self.low), _rounded(self.high)],
            "threshold": self.threshold,
            "decision": self.outcome,
            self.unit: self.count,
        }


def z_score(confidence: float) -> float:
    """The two-sided normal quantile of `confidence` (1.96 at 0.95)."""
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson_interval(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    """The Wilson score interval of a binomial share `successes` / `trials`; [0, 1] without trials."""
    if trials == 0:
        return 0.0, 1.0
    z = z_score(confidence)
    share, z2 = successes / trials, z * z
    denominator = 1 + z2 / trials
    centre = (share + z2 / (2 * trials)) / denominator
    half = z * math.sqrt(share * (1 - share) / trials + z2 / (4 * trials * trials)) / denominator
    # Exact at the ends: no successes cannot have a share below 0, nor all of them one above 1.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return low, high


def share_decision(
    check: str, successes: int, trials: int, threshold: float, confidence: float, unit: str = "requests"
) -> CheckDecision:
    """A share's check: fails when the interval is above `threshold`, holds when below. A threshold
    of 0 allows none: the first one fails the check, and none holds it (no interval is below 0)."""
    low, high = wilson_interval(successes, trials, confidence)
    value = successes / trials if trials else 0.0
    if threshold == 0.0:
        outcome: Outcome = "fails" if successes else "holds"
    else:
        outcome = _outcome(low, high, threshold)
    return CheckDecision(check, value, low, high, threshold, outcome, trials, unit)


def percentile_interval(
    ordered: Sequence[float], percentile: float, confidence: float
) -> tuple[float | None, float | None]:
    """A distribution-free interval for the `percentile` of the population `ordered` (sorted) was
    drawn from: the order statistics whose ranks the binomial(n, p) allows at `confidence`. None
    on a side where n is too small to bound it (100 requests cannot bound a p99 from above)."""
    from scipy.stats import binom

    n, p, tail = len(ordered), percentile / 100, (1 - confidence) / 2
    if n == 0:
        return None, None
    lower_rank = int(binom.ppf(tail, n, p))  # 1-based rank of the lower bound; 0: unbounded
    upper_rank = int(binom.ppf(1 - tail, n, p)) + 1  # beyond n: unbounded
    low = ordered[lower_rank - 1] if lower_rank >= 1 else None
    high = ordered[upper_rank - 1] if upper_rank <= n else None
    return low, high


def latency_decision(
    check: str, ordered: Sequence[float], value: float, percentile: float, max_ms: float, confidence: float
) -> CheckDecision:
    low, high = percentile_interval(ordered, percentile, confidence)
    return CheckDecision(check, value, low, high, max_ms, _outcome(low, high, max_ms), len(ordered))


def dkw_epsilon(n: int, alpha: float) -> float:
    """The Dvoretzky-Kiefer-Wolfowitz band: the empirical CDF of n draws lies within this of the
    true one everywhere, with probability 1 - alpha (Massart's tight constant)."""
    return math.sqrt(math.log(2 / alpha) / (2 * n)) if n else 1.0


def distance_decision(
    check: str, statistic: float, first: int, second: int, threshold: float, confidence: float
) -> CheckDecision:
    """The KS distance between the two models' true score distributions is within both samples'
    DKW bands of the observed one (each at half the error, so both hold together)."""
    alpha = (1 - confidence) / 2
    margin = dkw_epsilon(first, alpha) + dkw_epsilon(second, alpha)
    low, high = max(0.0, statistic - margin), min(1.0, statistic + margin)
    return CheckDecision(
        check, statistic, low, high, threshold, _outcome(low, high, threshold), min(first, second), "scores"
    )


def requests_to_decide(rate: float, threshold: float, confidence: float) -> int | None:
    """How many requests a share check needs, when its true share is `rate`, before its interval
    clears `threshold` (below it to hold, above it to fail); None: never (the rate is the threshold)
    or beyond NEEDED_CAP. The expected count: the share is taken as observed exactly."""
    if rate == threshold:
        return None
    if threshold == 0.0:
        return 1  # nothing is allowed: the first request that counts fails it, none holds it

    def decided(n: int) -> bool:
        low, high = wilson_interval(round(rate * n), n, confidence)
        return high < threshold if rate < threshold else low > threshold

    if not decided(NEEDED_CAP):
        return None
    lo, hi = 1, NEEDED_CAP
    while lo < hi:  # the smallest n that decides (monotone up to the rounding of rate * n)
        mid = (lo + hi) // 2
        if decided(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def requests_to_bound_percentile(percentile: float, confidence: float) -> int:
    """The fewest requests whose latencies can bound the `percentile` from above: the largest of
    n draws is above it with probability 1 - p**n, which must reach the one-sided confidence."""
    return math.ceil(math.log((1 - confidence) / 2) / math.log(percentile / 100))


def decision_budget(checks: Any, confidence: float) -> list[tuple[str, str, int | None]]:
    """(check, case, requests it needs to decide) for a canary's checks (`CanaryChecks`): each
    share check holding at none and at half its threshold and failing at twice it, and the
    latency percentile's upper bound. What a step must collect; `trainpipe canary-replay` prints it."""
    budget: list[tuple[str, str, int | None]] = []
    for name, threshold in (("error_rate", checks.max_error_rate), ("disagreement", checks.max_disagreement)):
        if threshold is None:
            continue
        budget.append(
            (name, f"holds at 0 (threshold {threshold:g})", requests_to_decide(0.0, threshold, confidence))
        )
        if threshold > 0:
            half, double = threshold / 2, min(1.0, threshold * 2)
            budget.append((name, f"holds at {half:g}", requests_to_decide(half, threshold, confidence)))
            budget.append((name, f"fails at {double:g}", requests_to_decide(double, threshold, confidence)))
    if checks.latency is not None:
        percentile = checks.latency.percentile
        budget.append(
            (
                f"latency_p{percentile:g}_ms",
                "an upper bound at all",
                requests_to_bound_percentile(percentile, confidence),
            )
        )
    return budget


def _outcome(low: float | None, high: float | None, threshold: float) -> Outcome:
    if low is not None and low > threshold:
        return "fails"
    if high is not None and high < threshold:
        return "holds"
    return "undecided"


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
