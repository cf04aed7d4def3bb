"""The scheduler: Optuna ask/tell over a static space of (operator, opportunity kind, parent rank) plus the
operators' own conditional parameters. The study lives in the run directory (a journal file), so a resumed
run continues it; a trial's value is its offspring's relative improvement over the best, failures are
told as failed.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import optuna
from omegaconf import DictConfig

from tik_evo.records import Opportunity

optuna.logging.set_verbosity(optuna.logging.WARNING)

# Opportunities handed out before any other, once each: split bundles and warm-start points (search.warm_start).
ONE_SHOT = ("split:", "seed:")


def make_sampler(name: str, seed: int, concurrent: bool = False, multivariate: bool = False
                 ) -> optuna.samplers.BaseSampler:
    """``multivariate``: TPE models the parameters jointly, grouped by which trials draw them together (the knobs
    of one opportunity, the knobs a condition brings into effect)."""
    if name == "tpe":
        # With audits in flight, TPE counts their trials as poor until told (constant liar), so concurrent
        # asks spread out instead of repeating the same choice.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # multivariate, group
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=6, constant_liar=concurrent,
                                              multivariate=multivariate, group=multivariate)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=8)
    if name == "bruteforce":
        return optuna.samplers.BruteForceSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r}")


class Scheduler:
    def __init__(self, cfg: DictConfig, run_dir: Path, kinds: dict[str, list[str]]):
        """``kinds`` maps each operator to the opportunity kinds it can act on (fixed for the run)."""
        self.cfg = cfg
        self.kinds = kinds
        storage = optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(run_dir / "study.journal")))
        self.study = optuna.create_study(study_name="search", storage=storage, direction="maximize",
                                         sampler=make_sampler(cfg.search.sampler, cfg.search.seed,
                                                             len(cfg.evaluate.gpus) > 1 or cfg.evaluate.parallel > 1,
                                                             cfg.search.multivariate),
                                         load_if_exists=True)

    def ask(self) -> optuna.Trial:
        return self.study.ask()

    def choose(self, trial: optuna.Trial, frontier: list[str], pending: list[Opportunity],
               best: str) -> tuple[str, Opportunity | None, str]:
        operators = [op for op in self.kinds if any(self._matches(o, k) for o in pending for k in self.kinds[op])]
        if not operators:
            raise LookupError("no pending opportunity any enabled operator can act on")
        op = trial.suggest_categorical("operator", list(self.kinds))
        if op not in operators:  # the static space still offers it; fall back deterministically
            op = operators[0]
        kind = trial.suggest_categorical(f"opportunity.{op}", self.kinds[op])
        # Split bundles go first whatever kind was drawn: they are one-shot checks of a change already measured
        # as faster, and the kind that produced them was just told a poor (over-limit) value. A queued one-knob
        # move (it names its parent) keeps its own opportunity: a split would fix another knob in its place.
        named = trial.user_attrs.get("parent")
        splits = [o for o in pending if o.origin.startswith(ONE_SHOT) and o.kind in self.kinds[op]]
        if named:
            pending = [o for o in pending if o not in splits] or pending
            splits = []
        candidates = splits or [o for o in pending if self._matches(o, kind)] or \
            [o for o in pending if any(self._matches(o, k) for k in self.kinds[op])]
        # Oldest first, so opportunities proposed later (follow-ups) wait their turn rather than starve.
        opportunity = sorted(candidates, key=lambda o: (o.uses, int(o.id[1:])))[0]
        rank = trial.suggest_int("parent_rank", 0, max(0, self.cfg.search.frontier_size - 1))
        if not self.cfg.ablation.lineage_management or not frontier:
            parent = best
        elif named in frontier:  # a queued move names its parent (see `queue`)
            parent = named
        else:
            parent = frontier[rank % len(frontier)]
        return op, opportunity, parent

    def queue(self, params: list[dict], parent: str) -> None:
        """Trials with these fixed parameters, from ``parent``, handed out before the sampler draws again."""
        for p in params:
            self.study.enqueue_trial(p, user_attrs={"parent": parent})

    @staticmethod
    def _matches(opportunity: Opportunity, kind: str) -> bool:
        # A split bundle keeps its family kind (the space stays static), and comes first among that kind's
        # candidates because it has never been used.
        split = opportunity.origin.startswith(ONE_SHOT)
        if kind == "follow-up":
            return opportunity.origin != "family" and not split
        return (opportunity.origin == "family" or split) and opportunity.kind == kind

    def tell(self, trial_number: int, value: float | None, note: str = "", overshoot: float | None = None) -> None:
        """``overshoot``: the offspring's worst time over a slowdown limit, as a fraction (<= 0 within every
        limit), set as the trial's constraint before its value: TPE then ranks infeasible trials after every
        feasible one, by how far they overshot (search.constraints)."""
        if overshoot is not None:
            try:
                trial = optuna.trial.Trial(self.study, self.study.trials[trial_number]._trial_id)
                trial.set_constraint("overshoot", overshoot)
            except (RuntimeError, ValueError, IndexError):
                pass  # already finished (a resumed run re-telling it)
        try:
            if value is None:
                self.study.tell(trial_number, state=optuna.trial.TrialState.FAIL)
            else:
                self.study.tell(trial_number, value)
        except (ValueError, RuntimeError):
            pass  # already told (a resumed run re-telling a finished trial)
        if note:
            self._set_attr(trial_number, "note", note)

    def _set_attr(self, trial_number: int, key: str, value) -> None:
        try:
            self.study._storage.set_trial_user_attr(self.study.trials[trial_number]._trial_id, key, value)
        except Exception:
            pass  # a finished trial's attributes are frozen (a resumed run re-telling it)

    def recover(self, outcome_of: dict[int, float | None], overshoot_of: dict[int, float] | None = None) -> int:
        """After a kill: tell every still-running trial what the IR recorded for it (failed if nothing)."""
        n = 0
        for t in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            self.tell(t.number, outcome_of.get(t.number), note="" if t.number in outcome_of else "interrupted",
                      overshoot=(overshoot_of or {}).get(t.number))
            n += 1
        return n


def trial_value(objective: float | None, best_objective: float | None) -> float | None:
    """Relative improvement over the best (positive is better); None for failures."""
    if objective is None or not best_objective:
        return None
    return (best_objective - objective) / best_objective

