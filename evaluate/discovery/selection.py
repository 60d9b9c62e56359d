"""Selection functions of the budgeted subdomain search: which subdomain to evaluate next.

A *subdomain* is one combination of values of the grid's factors (one value per factor). The
search alternates evaluation and selection: it starts from ``INITIAL`` random subdomains, then asks
a selection function for one subdomain at a time, never one already evaluated, until it has
evaluated ``count`` of them (``search``). Scores are failure rates: higher is worse, and every
selection function looks for the highest.

A selection function is a small class registered in ``SELECTIONS`` (``@SELECTIONS.register``)
that implements ONE method, ``choose(state) -> index``. The four of the seed:

- ``random``: uniform among the subdomains not yet evaluated;
- ``nwise``: the rows of a t-wise covering array (covertable, t = 2, the salt the seed), in the
  array's order, then random once the array is used up;
- ``genetic``: deap's tournament selection (size 3) of two parents among the evaluated
  subdomains, uniform crossover and a uniform mutation of each factor with probability
  1 / factors; the first child not yet evaluated is chosen (random after 50 tries);
- ``bo``: expected improvement over the worst failure rate seen so far under a Bayesian linear
  surrogate on the one-hot factor codes: scikit-learn's ``BayesianRidge`` with the library's
  defaults (its weight and noise precisions fitted by evidence maximisation). Its posterior
  predictive standard deviation of the mean failure rate (the observation noise left out, as
  BO's expected improvement of the latent objective does) keeps an unseen level's weight at its
  prior variance, so a class never evaluated stays uncertain and gets explored;
- ``bo_lasso_bootstrap``: the seed's predictor, a Lasso (alpha ``LASSO_ALPHA``) on the same codes,
  its uncertainty the spread of ``BOOTSTRAP`` Lassos, each fitted to a resample (with
  replacement) of the evaluated subdomains. A level never evaluated has coefficient 0 in every
  Lasso, so no spread and no expected improvement of its own: it is explored only by chance.

Either ``bo`` chooses the subdomain with the largest expected improvement (ties: the first in
grid order). ``surrogate_spearman`` measures a surrogate as the seed does: the rank correlation of
its predictions with the true scores, on the subdomains it was NOT fitted to.

Everything is seeded from the search seed: the same seed gives the same order of subdomains.
"""
from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping

import numpy as np
import random as python_random
from deap import base, tools
from scipy.stats import norm, spearmanr
from sklearn.linear_model import BayesianRidge, Lasso
from sklearn.preprocessing import OneHotEncoder

from counteraudit.evaluate.discovery.covering_arrays import covering_array
from counteraudit.train.core.artifacts import derive_seed
from counteraudit.train.core.registry import Registry

# Selection functions: registered in this module.
SELECTIONS: Registry = Registry("selection function", plugins="counteraudit.evaluate.discovery.selection")

INITIAL = 10             # random subdomains before any selection (the seed's warm start)
BOOTSTRAP = 8            # Lassos in bo_lasso_bootstrap's ensemble
LASSO_ALPHA = 0.005      # the surrogate's L1 penalty (scikit-learn's scaling); not tuned
EI_XI = 0.01             # expected improvement's exploration margin, in failure rate
GENETIC_TRIES = 50
TOURNAMENT = 3


class BudgetBelowInitial(ValueError):
    """A search asked to evaluate fewer subdomains than its random start."""


class Subdomains:
    """The feasible subdomains of a grid, in ``itertools.product`` order, with their value codes
    and one-hot encodings. ``covering(t, seed)`` returns covering-array rows (default:
    covertable on the grid, restricted to ``feasible``)."""

    def __init__(self, grid: Mapping[str, list[str]], feasible: Callable[[dict], bool] | None = None,
                 covering: Callable[[int, int], list[dict[str, str]]] | None = None):
        self.grid = {name: list(values) for name, values in grid.items()}
        self.names = list(self.grid)
        rows = [dict(zip(self.names, values)) for values in itertools.product(*self.grid.values())]
        self.rows = [row for row in rows if feasible is None or feasible(row)]
        if not self.rows:
            raise ValueError(f"no feasible subdomain in the grid {self.grid}")
        self.codes = np.array([[self.grid[f].index(row[f]) for f in self.names] for row in self.rows],
                              dtype=np.int64)
        self.position = {tuple(code): i for i, code in enumerate(self.codes.tolist())}
        encoder = OneHotEncoder(categories=[list(range(len(v))) for v in self.grid.values()])
        self.onehot = encoder.fit_transform(self.codes).toarray()
        self.feasible = feasible
        self._covering = covering

    def __len__(self) -> int:
        return len(self.rows)

    def index(self, row: Mapping[str, str]) -> int | None:
        return self.position.get(tuple(self.grid[f].index(row[f]) for f in self.names))

    def covering(self, t: int, seed: int) -> list[dict[str, str]]:
        if self._covering is not None:
            return self._covering(t, seed)
        return covering_array(self.grid, t, seed, self.feasible)


@dataclass
class SearchState:
    subdomains: Subdomains
    rng: np.random.Generator
    evaluated: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    _seen: set[int] = field(default_factory=set)

    def unevaluated(self) -> np.ndarray:
        return np.array([i for i in range(len(self.subdomains)) if i not in self._seen], np.int64)

    def add(self, index: int, score: float) -> None:
        self.evaluated.append(index)
        self.scores.append(float(score))
        self._seen.add(index)


class Selection(ABC):
    name: ClassVar[str]

    def __init__(self, subdomains: Subdomains, seed: int):
        self.subdomains, self.seed = subdomains, seed

    @abstractmethod
    def choose(self, state: SearchState) -> int:
        """The index of the next subdomain to evaluate; one not evaluated yet."""


@SELECTIONS.register
class RandomSelection(Selection):
    name = "random"

    def choose(self, state):
        return int(state.rng.choice(state.unevaluated()))


@SELECTIONS.register
class NwiseSelection(Selection):
    name = "nwise"
    t = 2

    def __init__(self, subdomains, seed):
        super().__init__(subdomains, seed)
        positions = (subdomains.index(row) for row in subdomains.covering(self.t, seed))
        self.queue = list(dict.fromkeys(p for p in positions if p is not None))

    def choose(self, state):
        for position in self.queue:
            if position not in state._seen:
                return position
        return int(state.rng.choice(state.unevaluated()))  # the array is used up


@SELECTIONS.register
class GeneticSelection(Selection):
    name = "genetic"

    def choose(self, state):
        class Fitness(base.Fitness):
            weights = (1.0,)  # maximise the failure rate

        def individual(position: int, score: float):
            member = Individual(state.subdomains.codes[position].tolist())
            member.fitness = Fitness((score,))
            return member

        population = [individual(p, s) for p, s in zip(state.evaluated, state.scores)]
        upper = [len(values) - 1 for values in state.subdomains.grid.values()]
        # deap draws from Python's global `random`: seed it per step, and restore it after.
        saved = python_random.getstate()
        python_random.seed(int(state.rng.integers(2**63)))
        try:
            for _ in range(GENETIC_TRIES):
                first, second = (Individual(p) for p in tools.selTournament(population, 2,
                                                                           TOURNAMENT))
                child, _ = tools.cxUniform(first, second, indpb=0.5)
                child, = tools.mutUniformInt(child, low=0, up=upper, indpb=1 / len(upper))
                position = state.subdomains.position.get(tuple(child))
                if position is not None and position not in state._seen:
                    return position
        finally:
            python_random.setstate(saved)
        return int(state.rng.choice(state.unevaluated()))


class Individual(list):
    """A subdomain's value codes, as deap's operators expect (a mutable sequence)."""


def bootstrap_lassos(features: np.ndarray, scores: np.ndarray, rng: np.random.Generator,
                     count: int = BOOTSTRAP) -> list:
    """``count`` Lassos, each fitted to a resample with replacement of (features, scores)."""
    models = []
    for _ in range(count):
        sample = rng.integers(len(scores), size=len(scores))
        models.append(fit_lasso(features[sample], scores[sample]))
    return models


def fit_lasso(features: np.ndarray, scores: np.ndarray):
    """scikit-learn's Lasso without its input validation (inputs are float64 arrays built here),
    which costs more than the fit itself on these small problems."""
    return Lasso(alpha=LASSO_ALPHA).fit(np.asfortranarray(features, dtype=np.float64),
                                        np.ascontiguousarray(scores, dtype=np.float64),
                                        check_input=False)


def predict(model, features: np.ndarray) -> np.ndarray:
    return features @ model.coef_ + model.intercept_


def expected_improvement(mean: np.ndarray, std: np.ndarray, best: float,
                         xi: float = EI_XI) -> np.ndarray:
    """E[max(Y - best - xi, 0)] for Y ~ N(mean, std^2) (std 0: the plain improvement)."""
    gain = mean - best - xi
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(std > 0, gain / np.where(std > 0, std, 1), 0.0)
    return np.where(std > 0, gain * norm.cdf(z) + std * norm.pdf(z), np.maximum(gain, 0.0))


class ExpectedImprovementSelection(Selection):
    """Bayesian optimisation's step: a surrogate's mean and standard deviation of every
    unevaluated subdomain's failure rate, and the one with the largest expected improvement."""

    @abstractmethod
    def surrogate(self, features: np.ndarray, scores: np.ndarray, candidates: np.ndarray,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) of the candidates' scores from the evaluated (features, scores)."""

    def choose(self, state):
        features = state.subdomains.onehot
        scores = np.asarray(state.scores)
        candidates = state.unevaluated()
        mean, std = self.surrogate(features[state.evaluated], scores, features[candidates],
                                   state.rng)
        gain = expected_improvement(mean, std, scores.max())
        return int(candidates[int(np.argmax(gain))])  # ties: the first in grid order


def fit_bayesian_ridge(features: np.ndarray, scores: np.ndarray) -> BayesianRidge:
    """scikit-learn's defaults: the principle is not to tune the surrogate to the benchmark."""
    return BayesianRidge().fit(features, scores)


def bayesian_ridge_posterior(model: BayesianRidge, features: np.ndarray):
    """(mean, std) of the mean score: the predictive std without the observation noise
    (1 / alpha_), i.e. sqrt(x' Sigma x), which for an unseen level's direction is the prior's."""
    mean, std = model.predict(features, return_std=True)
    return mean, np.sqrt(np.maximum(std ** 2 - 1.0 / model.alpha_, 0.0))


@SELECTIONS.register
class BayesianRidgeSelection(ExpectedImprovementSelection):
    name = "bo"

    def surrogate(self, features, scores, candidates, rng):
        return bayesian_ridge_posterior(fit_bayesian_ridge(features, scores), candidates)


@SELECTIONS.register
class LassoBootstrapSelection(ExpectedImprovementSelection):
    """The seed's design (its Lasso predictor), kept runnable by name."""
    name = "bo_lasso_bootstrap"

    def surrogate(self, features, scores, candidates, rng):
        predictions = np.stack([predict(m, candidates)
                                for m in bootstrap_lassos(features, scores, rng)])
        return predictions.mean(0), predictions.std(0)


# The surrogates whose held-out rank correlation the selection comparison reports: the seed's
# single Lasso and bo's Bayesian ridge (its posterior mean).
SURROGATE_MEANS: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    "lasso": lambda x, y, new: predict(fit_lasso(x, y), new),
    "bayesian_ridge": lambda x, y, new: fit_bayesian_ridge(x, y).predict(new),
}


def surrogate_spearman(surrogate: str, subdomains: Subdomains, evaluated: list[int],
                       scores: list[float], truth: np.ndarray) -> float:
    """Spearman correlation between the surrogate fitted to the evaluated subdomains and the true
    scores of the subdomains NOT evaluated (held out): how well it predicts what it has not seen,
    the seed's measure of its predictors."""
    held_out = np.setdiff1d(np.arange(len(subdomains)), evaluated)
    if len(held_out) < 2:
        return float("nan")
    predicted = SURROGATE_MEANS[surrogate](subdomains.onehot[evaluated], np.asarray(scores),
                                           subdomains.onehot[held_out])
    if np.ptp(predicted) == 0 or np.ptp(truth[held_out]) == 0:
        return float("nan")  # a constant has no rank correlation
    return float(spearmanr(predicted, truth[held_out]).statistic)


def search(subdomains: Subdomains, score: Callable[[int], float], selection: str, count: int,
           seed: int, initial: int = INITIAL) -> SearchState:
    """Evaluate ``count`` distinct subdomains (all of them if fewer): ``initial`` at random, then
    one at a time as the selection function chooses. Returns the order and the scores."""
    chooser_class = SELECTIONS.get(selection)  # an unknown name lists the valid ones
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < initial:
        raise BudgetBelowInitial(f"a search of {count!r} subdomains is below the {initial} random "
                                 f"ones it starts from; the minimum is {initial} subdomains")
    count = min(int(count), len(subdomains))
    state = SearchState(subdomains, np.random.default_rng(derive_seed(seed, "surrogate_search")))
    for position in state.rng.permutation(len(subdomains))[:min(initial, count)]:
        state.add(int(position), score(int(position)))
    chooser = chooser_class(subdomains, seed)
    while len(state.evaluated) < count:
        position = chooser.choose(state)
        if not 0 <= position < len(subdomains) or position in state._seen:
            raise RuntimeError(f"selection function {selection} chose subdomain {position}, "
                               "evaluated already or outside the grid: a bug in its choose()")
        state.add(int(position), score(int(position)))
    return state


def describe_selections() -> dict[str, Any]:
    return {"selections": SELECTIONS.names(), "initial": INITIAL, "bootstrap": BOOTSTRAP,
            "lasso_alpha": LASSO_ALPHA, "ei_xi": EI_XI,
            "bayesian_ridge": BayesianRidge().get_params(), "surrogates": list(SURROGATE_MEANS)}
