"""One small widget per pane; each takes a RunView in ``show(view)`` and keeps its own cursor."""
