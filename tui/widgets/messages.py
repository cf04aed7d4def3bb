"""Messages the panes send to the app (kept apart so widgets do not import each other)."""

from __future__ import annotations

from textual.message import Message


class ImplChosen(Message):
    """An implementation was highlighted (``open`` False) or chosen with Enter (``open`` True)."""

    def __init__(self, impl_id: str, open: bool) -> None:
        super().__init__()
        self.impl_id = impl_id
        self.open = open
