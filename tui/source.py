"""Read-only access to a run's store, and the cheap "did anything change?" probe the app polls."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

from tik_evo.run_state import RunState
from tik_evo.store import Store, StoreError
from tui.model import RunConfig, RunView


def change_key(state: RunState) -> tuple:
    # Every engine transaction bumps the step, an event count or a record counter; comparing these avoids
    # re-reading every record each second.
    return (state.step, state.events, state.evaluations, tuple(sorted(state.counters.items())),
            bool(state.finished), state.best, state.kappa)


# Polls in a row a store may refuse to open or give its state while a run is being made (its tables, then its
# state, are written a moment after data.mdb appears); past that the error is the store's own (a damaged record,
# a wrong path) and the app shows it.
PATIENCE = 5


class RunSource:
    """Owns the reader for one run directory (or borrows an already-open Store)."""

    def __init__(self, run_dir: Path, store: Store | None = None):
        self.run_dir = Path(run_dir)
        self._owned = store is None
        self.store = store
        self.config = RunConfig.load(self.run_dir)
        self._key: tuple | None = None
        self.next_event = 0
        self._refusals = 0

    def _refused(self, e: StoreError) -> None:
        self._refusals += 1
        if self._refusals >= PATIENCE:
            raise e

    def _open(self) -> bool:
        # `tik-evo run --tui` starts the app as soon as data.mdb exists, which can be before the engine
        # has created its tables: keep trying on each poll instead of failing (for PATIENCE polls).
        if self.store is None:
            try:
                self.store = Store.open_reader(self.run_dir)
            except StoreError as e:
                gc.collect()  # drop the half-opened LMDB environment before the next attempt
                self._refused(e)
                return False
        return True

    @property
    def ready(self) -> bool:
        return self.store is not None

    def poll(self) -> RunView | None:
        """A fresh view when the run changed since the last call, else None."""
        if not self._open():
            return None
        try:
            key = change_key(self.store.state())
        except StoreError as e:  # tables exist but Store.create has not written the state yet: a moment later it has
            self._refused(e)
            return None
        self._refusals = 0
        if key == self._key:
            return None
        snap = self.store.snapshot()
        self._key = change_key(snap["state"])
        if self.config.kappa_threshold is None:  # the engine may write config.yaml after the store
            self.config = RunConfig.load(self.run_dir)
        return RunView(snap, self.config)

    def new_events(self) -> list[dict[str, Any]]:
        if self.store is None:
            return []
        events = self.store.events(self.next_event)
        if events:
            self.next_event = events[-1]["n"] + 1
        return events

    def source(self, h: str) -> str:
        try:
            return self.store.source(h) if self.store is not None else ""
        except StoreError:
            return ""

    def close(self) -> None:
        if self._owned and self.store is not None:
            self.store.close()
            self.store = None
