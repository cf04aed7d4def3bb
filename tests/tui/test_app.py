"""The app under Textual's pilot at 80x24: main screen, navigation, selection, detail, help."""

from __future__ import annotations

from textual.widgets import TabbedContent
from tui_pilot import sync

from tui.app import TikEvoApp
from tui.widgets.detail import DetailPane
from tui.widgets.lineage import LineageTree

SIZE = (80, 24)


@sync
async def test_main_screen_at_80x24(gpu_run, text, tmp_path):
    app = TikEvoApp(gpu_run)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = text(app)
        lines = screen.splitlines()
        # Snapshot-like: the layout's fixed lines and the frontier's order and numbers.
        assert lines[0].startswith(" RUNNING  step 6  evals 6  best I3 1.233×  κ 2/4")
        assert "1 Frontier  2 Lineage  3 Detail  4 Progress  5 Opps  6 Events" in lines[1]
        assert "4 verified of 6 implementations" in lines[3]
        assert lines[4].split() == ["impl", "status", "×root", "full", "decode", "T(I)", "scope", "operator",
                                    "timer"]
        assert lines[5].split()[:5] == ["I3", "best", "1.233×", "1.220×", "1.408×"]
        assert [ln.split()[0] for ln in lines[5:9]] == ["I3", "I4", "I1", "I0"]
        assert "cuda-event" in lines[5] and "interp" not in screen
        assert "? help" in lines[-1]
        assert all(len(ln) <= 80 for ln in lines) and len(lines) == 24
        app.save_screenshot(path=str(tmp_path), filename="main.svg")  # kept for a human to look at on failure


@sync
async def test_frontier_enter_opens_detail(gpu_run, text):
    app = TikEvoApp(gpu_run)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", "enter")  # I4, second row
        await pilot.pause()
        assert app.query_one(TabbedContent).active == "detail"
        assert app.selected == "I4"
        screen = text(app)
        assert "I4 archived  scope full  operator knob  parents I1" in screen
        assert "qwen3-4b.full.T8192" in screen and "of limit" in screen and "vs parent" in screen
        assert "rationale: 4 rows per program amortise the weight load" in screen
        assert "tokens: prompt 1800, completion 420" in screen
        await pilot.press("end")
        await pilot.pause()
        screen = text(app)
        assert '+    "FULL_ROWS_PER_PROGRAM": 4,' in screen  # the diff against its parent
        assert "decode == full rows (fp32) T70xH1000/seed1" in screen or "✓" in screen


@sync
async def test_lineage_shows_failed_nodes_and_selects(gpu_run, text):
    app = TikEvoApp(gpu_run)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await pilot.pause()
        assert app.query_one(TabbedContent).active == "lineage"
        tree = app.query_one(LineageTree)
        assert app.focused is tree
        screen = text(app)
        for needle in ("I0 archived", "I1 active", "I2 failed", "I3 best", "I4 archived", "I5 abandoned"):
            assert needle in screen
        tree.select_impl("I2")
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        assert app.selected == "I2" and app.query_one(TabbedContent).active == "detail"
        body = str(app.query_one(DetailPane).query_one("#detail-body").render())
        screen = text(app)
        assert "audit U2: FAILED" in screen
        assert "failure (bitwise): decode != full bitwise (fp32)" in screen
        assert "no measurements" in screen
        assert body is not None


@sync
async def test_failed_check_is_listed(gpu_run, text):
    app = TikEvoApp(gpu_run)
    async with app.run_test(size=(80, 60)) as pilot:  # tall enough to see the checks without scrolling
        await pilot.pause()  # let the frontier's initial highlight land first
        app.on_impl_chosen(type("M", (), {"impl_id": "I2", "open": True})())
        await pilot.pause()
        screen = text(app)
        assert "✗" in screen and "412 of 9000" in screen
        assert "allowed imports" in screen
        assert "BLOCK_H=1024" in screen  # structured details flattened, not a crash


@sync
async def test_opportunity_evidence_link(gpu_run, text):
    app = TikEvoApp(gpu_run)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        await pilot.pause()
        screen = text(app)
        assert "consumed ×1" in screen and "withdrawn" in screen and "audit:U4" in screen
        assert "O0 reduction_width" in screen and "knobs —" in screen  # the highlighted one in full
        await pilot.press("down", "down", "down", "down")  # O4: evidence U4, I4
        await pilot.pause()
        assert "O4 merge full schedule of I4 into I3" in text(app) and "Enter opens I4" in text(app)
        await pilot.press("enter")
        await pilot.pause()
        assert app.selected == "I4" and app.query_one(TabbedContent).active == "detail"


@sync
async def test_progress_help_and_best(gpu_run, text):
    app = TikEvoApp(gpu_run)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await pilot.pause()
        screen = text(app)
        assert "best-so-far speed-up over root" in screen and "▲" in screen and "evaluation 5" in screen
        assert "2 / 4 non-improving in a row" in screen and "6 / 40" in screen and "$0.07 / $5.00" in screen
        assert "failures by kind: bitwise 1" in screen
        await pilot.press("question_mark")
        await pilot.pause()
        assert "fold / unfold a lineage subtree" in text(app)
        await pilot.press("escape")
        await pilot.pause()
        assert "fold / unfold" not in text(app)
        await pilot.press("6")
        await pilot.pause()
        assert "I3 is the new best" in text(app)
        await pilot.press("b")
        await pilot.pause()
        assert app.selected == "I3" and app.query_one(TabbedContent).active == "detail"


@sync
async def test_interpreter_timings_are_labelled_and_finished_run_browses(interp_run, text):
    app = TikEvoApp(interp_run)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = text(app)
        assert screen.startswith(" FINISHED ") and "INTERPRETER TIMINGS" in screen
        assert "timings: Triton interpreter: CPU wall clock, not GPU time" in screen
        assert screen.count("interp") >= 5  # the bar, the note and a timer cell per frontier row
        await pilot.press("enter")
        await pilot.pause()
        screen = text(app)
        assert "⚠ Triton interpreter" in screen and "Triton interpreter wall clock" in screen and "µs*" in screen
        await pilot.press("4")
        await pilot.pause()
        assert "(interpreter wall clock)" in text(app)


@sync
async def test_run_bar_counts_the_one_knob_moves_left(live_run, text):
    from tik_evo.store import Store

    with Store.open_writer(live_run) as s, s.transaction() as txn:
        txn.state["moves"] = {"of": "I3", "left": [{"knob.BLOCK_H": 0}] * 3, "skip": False}
        txn.state["budgets"] = {**txn.state["budgets"], "wall_s": 120.0}
    app = TikEvoApp(live_run)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        bar = text(app).splitlines()[0]
        # and offspring a minute of the run's wall time after the root's audit: 5 in 120 - 5.5 s
        assert "κ 2/4  moves 3 left  2.6 audits/min" in bar, bar
