"""Statistics of repeated measurements: bootstrap intervals and the regression test. Pure.

Everything here works on throughputs (higher is better) and on *relative* changes, and is exact
rather than Monte-Carlo: a result never depends on a random seed.

**Bootstrap of a median.** Resampling ``m`` values with replacement and taking the median has
a distribution that depends only on which sorted positions end up in the middle;
:func:`median_index_pmf` gives its exact probabilities (multinomial counting), so the bootstrap
distribution of a median (:func:`median_bootstrap`) is exact with no resampling loop.

**Compare two runs** (:func:`compare_samples`): change = median(B) / median(A) - 1; its
confidence interval is the percentile interval of the exact bootstrap distribution of
median(B*) / median(A*) - 1, each run's repeats resampled independently. Verdict: ``faster`` /
``slower`` when the interval excludes 0, the change is beyond the threshold *and* the exact
permutation test rejects "no change" at the same level (:func:`permutation_test`, the rank-sum
test: every way of splitting the pooled repeats into two sets of the runs' sizes is equally
likely when nothing changed); else ``no significant change``. With few repeats
no split can reach the level (2 a side: the most extreme of the 6 splits has p = 2/6; 3 a side:
2/20 = 0.10): the verdict is then ``too few repeats``, as it is with a single repeat on a side
(no interval). Why the second test: the bootstrap interval of a median is too narrow for small
samples (with 2 repeats a side it is the range of the ratios of single values, and it excludes
0 whenever the two pairs do not overlap, which two runs of the same code do one time in three),
while the permutation test's level holds for any number of repeats and any distribution
(benchmarks/compare_false_alarms.py measures both). The permutation test is exact up to
:data:`PERMUTATION_MAX_SPLITS` splits (8 repeats a side); beyond, the bootstrap interval alone
decides, its false-alarm rate being near its level there.

**Regression check** (:func:`regression_test`), per configuration: the newest run's median
against the reference, the median of the earlier runs' medians, in a random-effects model on
the log scale. A run's median deviates from the truth by the run's own offset (load, clocks,
placement: variance tau^2, shared by the runs of a matrix) plus its sampling noise over its
repeats (variance v: the exact bootstrap variance of the median of its repeats, different for
every run). tau^2 comes from the earlier runs of every configuration of the matrix, pooled: each
earlier run's leave-one-out deviation d (its median against the median of the others) with its
v, solved for ``median(d^2 / (tau^2 + v)) = median of chi^2_1`` (:func:`between_run_variance`),
so runs whose own repeats were noisy, and a few wild runs, do not inflate it. The newest run is
then a Student-t test of log(newest / reference) with variance tau^2 + v_new + v_ref, degrees of
freedom from the pooled deviations. Verdict: ``regression`` when the one-sided p < ``alpha``
*and* the drop is beyond the threshold; ``faster`` the same way upwards; else ``no significant
change``. Over the configurations of a run the p-values are adjusted with Holm's method
(:func:`holm`), so ``alpha`` bounds the chance of *any* false alarm in a night, whatever the
number of configurations.

**Unstable repeat sets** (:func:`unstable`): a configuration whose ok repeats spread more than
:data:`UNSTABLE_SPREAD` of their median ((max - min) / median, at least
:data:`UNSTABLE_MIN_REPEATS` repeats: two) measured an unsteady machine; the tables mark it, as
hyperfine warns on outliers. The range of two values is the rule's most cautious case, not a
weaker one: steady noise spreads two values less than three (the expected range of n normal
values is 1.13 sd for n = 2, 1.69 sd for n = 3), so a bound a steady machine stays within at
three repeats it stays within at two.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

#: A discrete distribution: (value, probability) pairs, sorted by value.
Dist = list[tuple[float, float]]


# --- exact bootstrap of a median -------------------------------------------------------------


@lru_cache(maxsize=4096)
def _multinomial(counts: tuple[int, ...]) -> float:
    """``n! / (c1! c2! ...)`` with ``n = sum(counts)``, as a float."""
    return math.exp(math.lgamma(sum(counts) + 1) - sum(math.lgamma(c + 1) for c in counts))


@lru_cache(maxsize=128)
def median_index_pmf(m: int) -> tuple[tuple[int, int, float], ...]:
    """Exact ``P(lo, hi)`` of the middle sorted positions of a size-``m`` resample with
    replacement from ``m`` sorted values (0-based; ``lo == hi`` for odd ``m``).

    The resample's median is ``(x[lo] + x[hi]) / 2``.
    """
    if m < 1:
        raise ValueError("need at least one value")
    out: list[tuple[int, int, float]] = []
    if m % 2:
        k = (m + 1) // 2  # the median is the k-th order statistic (1-based)

        def at_least_k(p: float) -> float:  # P(Binomial(m, p) >= k)
            return sum(math.comb(m, n) * p**n * (1 - p) ** (m - n) for n in range(k, m + 1))

        for i in range(m):
            prob = at_least_k((i + 1) / m) - at_least_k(i / m)
            if prob > 0:
                out.append((i, i, prob))
        return tuple(out)
    a = m // 2  # the median averages order statistics a and a + 1 (1-based)
    unit = 1.0 / m
    for i in range(m):
        below = i / m
        above_i = (m - 1 - i) / m
        # both middle statistics at position i: fewer than a draws below i, and at least
        # a + 1 draws at or below i
        same = 0.0
        for n1 in range(a):
            for n2 in range(a + 1 - n1, m - n1 + 1):
                rest = m - n1 - n2
                same += (_multinomial((n1, n2, rest))
                         * below**n1 * unit**n2 * above_i**rest)
        if same > 0:
            out.append((i, i, same))
        for j in range(i + 1, m):
            above_j = (m - 1 - j) / m
            # exactly a draws at or below i (at least one at i), none strictly between i
            # and j, at least one at j
            prob = 0.0
            for n1 in range(a):
                for n3 in range(1, m - a + 1):
                    rest = m - a - n3
                    prob += (_multinomial((n1, a - n1, n3, rest))
                             * below**n1 * unit ** (a - n1) * unit**n3 * above_j**rest)
            if prob > 0:
                out.append((i, j, prob))
    return tuple(out)


def _merge(points: list[tuple[float, float]]) -> Dist:
    points.sort()
    out: Dist = []
    for value, prob in points:
        if out and out[-1][0] == value:
            out[-1] = (value, out[-1][1] + prob)
        else:
            out.append((value, prob))
    return out


def median_bootstrap(values: Sequence[float]) -> Dist:
    """The exact bootstrap distribution of the median of ``values``."""
    x = sorted(float(v) for v in values)
    return _merge([((x[lo] + x[hi]) / 2.0, p) for lo, hi, p in median_index_pmf(len(x))])


def quantile(dist: Dist, q: float) -> float:
    """The ``q`` quantile of a discrete distribution (the smallest value with CDF >= q)."""
    total = 0.0
    for value, prob in dist:
        total += prob
        if total >= q - 1e-12:
            return value
    return dist[-1][0]


# --- compare two runs ------------------------------------------------------------------------


#: The verdict of a comparison whose repeats cannot show a change at the level asked
#: (:func:`compare_samples`).
TOO_FEW_REPEATS = "too few repeats"
#: Up to this many splits of the pooled repeats the permutation test is exact (8 + 8 repeats:
#: 12,870 splits, 0.005 s on the 2-core VM); beyond, the bootstrap interval decides alone.
PERMUTATION_MAX_SPLITS = 13_000


@dataclass(frozen=True)
class Change:
    """Run B against run A for one configuration."""

    change: float  # median(B) / median(A) - 1
    low: float | None  # confidence interval of the change (None: fewer than 2 repeats a side)
    high: float | None
    verdict: str  # faster | slower | no significant change | too few repeats
    #: The permutation test's two-sided p-value (None: not computed: a side with one repeat,
    #: or more splits than PERMUTATION_MAX_SPLITS).
    p: float | None = None


@dataclass(frozen=True)
class Permutation:
    """The exact permutation test of "no change" (the rank-sum test: Wilcoxon, Mann-Whitney)."""

    p: float  # two-sided: the share of splits at least as far from the middle as the observed
    smallest: float  # the smallest p any split of these repeats could give
    splits: int


def _midranks(values: Sequence[float]) -> list[float]:
    """Each value's rank among ``values`` (1-based; tied values share their mean rank)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def permutation_test(a: Sequence[float], b: Sequence[float]) -> Permutation | None:
    """The exact two-sided rank-sum test of B against A: every split of the pooled repeats into
    sets of the runs' sizes is equally likely when nothing changed, and the statistic is how
    far B's rank sum lies from its middle. Ranks make it robust to the one wild repeat a shared
    machine gives, as the medians are. Also the smallest p-value any split could give (2 / C(n,
    k) without ties). None when there are more than :data:`PERMUTATION_MAX_SPLITS` splits."""
    ranks = _midranks([float(v) for v in (*a, *b)])
    n, k = len(ranks), len(b)
    splits = math.comb(n, k)
    if splits > PERMUTATION_MAX_SPLITS:
        return None
    middle = k * (n + 1) / 2
    tolerance = 1e-9
    observed = abs(sum(ranks[len(a):]) - middle)
    far = [abs(sum(ranks[i] for i in chosen) - middle)
           for chosen in itertools.combinations(range(n), k)]
    top = max(far)
    at_least = sum(1 for d in far if d >= observed - tolerance)
    extreme = sum(1 for d in far if d >= top - tolerance)
    return Permutation(at_least / splits, extreme / splits, splits)


def compare_samples(a: Sequence[float], b: Sequence[float], confidence: float = 0.95,
                    threshold: float = 0.0) -> Change:
    """Compare B's repeats with A's (both non-empty): change, bootstrap interval, verdict
    (``faster`` / ``slower`` needs both the interval and the permutation test,
    ``too few repeats`` when no outcome of these repeats could show a change)."""
    if not a or not b:
        raise ValueError("both samples need values")
    change = statistics.median(b) / statistics.median(a) - 1.0
    if len(a) < 2 or len(b) < 2:
        return Change(change, None, None, TOO_FEW_REPEATS)
    dist_a, dist_b = median_bootstrap(a), median_bootstrap(b)
    ratio = _merge([(vb / va - 1.0, pa * pb) for va, pa in dist_a for vb, pb in dist_b])
    tail = (1.0 - confidence) / 2.0
    low, high = quantile(ratio, tail), quantile(ratio, 1.0 - tail)
    level = 1.0 - confidence + 1e-9
    perm = permutation_test(a, b)
    if perm is not None and perm.smallest > level:
        return Change(change, low, high, TOO_FEW_REPEATS, perm.p)
    significant = perm is None or perm.p <= level
    if low > 0 and change > threshold and significant:
        verdict = "faster"
    elif high < 0 and change < -threshold and significant:
        verdict = "slower"
    else:
        verdict = "no significant change"
    return Change(change, low, high, verdict, perm.p if perm else None)


def repeats_needed(confidence: float) -> int:
    """The fewest repeats a side (the same on both) with which some outcome can show a change
    at ``confidence`` (:func:`permutation_test`: 2 / C(2n, n) at most 1 - confidence)."""
    n = 2
    while 2 / math.comb(2 * n, n) > 1.0 - confidence + 1e-9:
        n += 1
    return n


# --- the regression test ---------------------------------------------------------------------


def median_log_variance(values: Sequence[float]) -> float:
    """Variance of log(median) under the exact bootstrap of ``values`` (0 for one value)."""
    now = statistics.median(values)
    dist = [(math.log(v / now), p) for v, p in median_bootstrap(values)]
    mean = sum(p * e for e, p in dist)
    return sum(p * (e - mean) ** 2 for e, p in dist)


def loo_deviations(run_medians: Sequence[float]) -> list[float]:
    """log(median of run j / median of the other runs), for each earlier run j (2 or more)."""
    out = []
    for j, value in enumerate(run_medians):
        others = [v for k, v in enumerate(run_medians) if k != j]
        if others and value > 0:
            out.append(math.log(value / statistics.median(others)))
    return out


#: The median of a chi-squared variable with one degree of freedom.
_CHI2_1_MEDIAN = 0.454936


def between_run_variance(pairs: Sequence[tuple[float, float]], floor: float) -> float:
    """tau^2, the variance of a run's own offset, from (deviation, its within-run variance)
    pairs of earlier runs: the value with ``median(d^2 / (tau^2 + v)) = median of chi^2_1``
    (a median version of the Paule-Mandel estimator), at least ``floor^2``.

    A run whose deviation its own repeats explain (large ``v``) does not raise tau^2; a few
    wild runs move a median, not a mean.
    """
    if not pairs:
        return floor * floor

    def excess(tau2: float) -> float:
        return statistics.median(d * d / max(tau2 + v, 1e-300) for d, v in pairs) - (
            _CHI2_1_MEDIAN)

    lo, hi = 0.0, max(d * d for d, _ in pairs) / _CHI2_1_MEDIAN + 1e-12
    if excess(lo) <= 0:
        return floor * floor
    for _ in range(100):  # bisection: excess() falls as tau^2 grows
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
    return max(hi, floor * floor)


def student_t_cdf(t: float, dof: int) -> float:
    """P(T <= t) for Student's t with ``dof`` >= 1 degrees of freedom (exact series for integer
    dof up to 200, the normal distribution beyond)."""
    if dof > 200:
        return 0.5 * math.erfc(-t / math.sqrt(2.0))
    theta = math.atan(t / math.sqrt(dof))
    c, s = math.cos(theta), math.sin(theta)
    if dof % 2:  # Abramowitz & Stegun 26.7.3
        total, term = 0.0, c
        for k in range(1, (dof - 1) // 2 + 1):
            total += term
            term *= c * c * (2 * k) / (2 * k + 1)
        a = (2.0 / math.pi) * (theta + (s * total if dof > 1 else 0.0))
    else:  # 26.7.4
        total, term = 0.0, 1.0
        for k in range(1, dof // 2 + 1):
            total += term
            term *= c * c * (2 * k - 1) / (2 * k)
        a = s * total
    return 0.5 * (1.0 + a)


@dataclass(frozen=True)
class Check:
    """The newest run of one configuration against its history."""

    change: float  # newest median / reference - 1
    reference: float
    p_slower: float  # P(a ratio this low | nothing changed)
    p_faster: float
    noise: float  # the null's 95 % half-width, as a relative change
    verdict: str  # regression | faster | no significant change
    scale: float = 0.0  # sd of log(newest / reference) under the null
    dof: int = 1


def regression_test(
    newest: Sequence[float],
    earlier: Sequence[Sequence[float]],
    tau2: float,
    dof: int,
    threshold: float,
    alpha: float = 0.01,
) -> Check:
    """Test the newest run's repeats against the earlier runs' (each a non-empty list).

    ``tau2``: the between-run variance (:func:`between_run_variance` over the pooled earlier
    runs of every configuration), ``dof`` its degrees of freedom. ``threshold``: the smallest
    relative change worth flagging (0.05 for 5 %).

    Under "nothing changed", log(newest median / reference) has variance
    tau^2 + v_new + v_ref: the newest run's offset, its own sampling noise (the exact bootstrap
    variance of the median of its repeats) and the reference's (the median of ``n`` run
    medians: about pi/2 times their mean variance over n). The p-values are Student's t tails.
    """
    medians = [statistics.median(run) for run in earlier]
    reference = statistics.median(medians)
    now = statistics.median(newest)
    observed = math.log(now / reference)
    v_new = median_log_variance(newest)
    v_runs = [tau2 + median_log_variance(run) for run in earlier]
    v_ref = (math.pi / 2) * statistics.fmean(v_runs) / len(earlier)
    scale = math.sqrt(tau2 + v_new + v_ref)
    z = observed / scale
    p_low, p_high = student_t_cdf(z, dof), student_t_cdf(-z, dof)
    change = now / reference - 1.0
    return Check(change, reference, p_low, p_high, math.expm1(1.96 * scale),
                 verdict(change, p_low, p_high, alpha, threshold), scale, dof)


def student_t_quantile(q: float, dof: int) -> float:
    """The ``q`` quantile of Student's t with ``dof`` degrees of freedom (bisection on
    :func:`student_t_cdf`; 0 < q < 1)."""
    if not 0.0 < q < 1.0:
        raise ValueError("q must be between 0 and 1")
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if student_t_cdf(mid, dof) < q else (lo, mid)
    return (lo + hi) / 2


def detectable_drop(check: Check, alpha: float, threshold: float, power: float = 0.95) -> float:
    """The smallest drop (a positive fraction: 0.1 for -10 %) that the test flags with
    probability ``power`` given ``check``'s noise: log-drop = (t_(1-alpha) + t_power) * scale,
    and never below ``threshold``. ``alpha`` is the level the p-value must reach (the run's
    Holm worst case: alpha over the number of configurations tested).

    It tells whether a nightly can catch the slowdown a lab cares about at all: with 5 %
    run-to-run noise a 10 % drop is a coin toss, whatever the test.
    """
    z = student_t_quantile(1.0 - alpha, check.dof) + student_t_quantile(power, check.dof)
    return max(threshold, -math.expm1(-z * check.scale))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment: family-wise error control over several tests (in order)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    out = [1.0] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        out[i] = running
    return out


def verdict(change: float, p_slower: float, p_faster: float, alpha: float, threshold: float
            ) -> str:
    """regression / faster / no significant change, from (adjusted) one-sided p-values."""
    if p_slower < alpha and change < -threshold:
        return "regression"
    if p_faster < alpha and change > threshold:
        return "faster"
    return "no significant change"


# --- unstable repeat sets ----------------------------------------------------------------------
#: A repeat set is unstable when its relative range exceeds this: (max - min) / median > 10 %.
#: Run-to-run noise measured here is 4-7 % (the same cell repeated on an idle machine), so 10 %
#: is beyond what a steady machine produces and flags sets like 8 -> 37 images/s (a CPU shared
#: with another job, clocks held down) without flagging ordinary noise.
UNSTABLE_SPREAD = 0.10
#: Fewer ok repeats than this are never judged (one value has no spread). Two are: their range
#: is the rule's most cautious case (steady noise spreads two values less than three).
UNSTABLE_MIN_REPEATS = 2
#: The rule as the tables' footnotes state it.
UNSTABLE_RULE = (f"(max - min) / median > {UNSTABLE_SPREAD * 100:.0f} % over at least "
                 f"{UNSTABLE_MIN_REPEATS} ok repeats")


def spread(values: Sequence[float]) -> float | None:
    """The relative range of a repeat set: (max - min) / median; None for fewer than
    :data:`UNSTABLE_MIN_REPEATS` values or a median that is not positive."""
    if len(values) < UNSTABLE_MIN_REPEATS:
        return None
    middle = statistics.median(values)
    if not middle > 0:
        return None
    return (max(values) - min(values)) / middle


def unstable(values: Sequence[float]) -> bool | None:
    """Whether a repeat set spreads beyond :data:`UNSTABLE_SPREAD` (hyperfine warns on such
    outliers); None when it is not judged (too few repeats)."""
    found = spread(values)
    return None if found is None else found > UNSTABLE_SPREAD
