"""Lineage tree of the derivation graph, every node coloured by status (failed ones included)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from tui.model import STATUS_STYLE, RunView, fmt_x
from tui.widgets.messages import ImplChosen


class LineageTree(Tree[str]):
    def __init__(self, **kwargs) -> None:
        super().__init__("lineage", **kwargs)
        self.show_root = False
        self.guide_depth = 3
        self.auto_expand = False  # Enter opens the detail pane; space still folds a subtree
        self._by_id: dict[str, TreeNode[str]] = {}

    def label_for(self, view: RunView, impl_id: str) -> Text:
        impl = view.impls[impl_id]
        t = Text(f"{impl.id} ", style="bold")
        t.append(impl.status, style=STATUS_STYLE.get(impl.status, ""))
        if impl.status not in ("failed", "abandoned") or impl.objective is not None:
            t.append(f" {fmt_x(view.speedup(impl_id))}")
        t.append(f"  {impl.scope} · {view.operator_of(impl_id)}", style="dim")
        if len(impl.parents) > 1:
            t.append(f"  merge +{','.join(impl.parents[1:])}", style="italic")
        return t

    def show(self, view: RunView) -> None:
        # Grow the tree in place: rebuilding it would collapse what the user expanded and lose the cursor.
        kids = view.children()
        todo = [(None, self.root)]
        while todo:
            parent, node = todo.pop()
            for cid in kids.get(parent, []):
                child = self._by_id.get(cid)
                if child is None:
                    # Leaves get no fold arrow until an offspring arrives under them.
                    node.allow_expand = True
                    child = node.add(self.label_for(view, cid), data=cid, expand=True, allow_expand=False)
                    self._by_id[cid] = child
                else:
                    child.set_label(self.label_for(view, cid))
                todo.append((cid, child))
        if self.cursor_node is None and self._by_id:  # so Enter works before the first arrow key
            # Node line numbers exist only after the tree has laid itself out.
            self.call_after_refresh(self.select_impl, view.state.best or next(iter(self._by_id)))

    def select_impl(self, impl_id: str) -> None:
        node = self._by_id.get(impl_id)
        if node is not None:
            self.move_cursor(node)

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted) -> None:
        # Only a pane the user is in may move the selection: refreshes re-highlight rows in hidden panes.
        if self.has_focus and event.node.data:
            self.post_message(ImplChosen(event.node.data, open=False))

    def on_tree_node_selected(self, event: Tree.NodeSelected) -> None:
        if event.node.data:
            self.post_message(ImplChosen(event.node.data, open=True))
