"""Textual TUI for tik-evo runs: `tik-evo tui RUN_DIR` calls tui.app.run_tui (textual is imported only here)."""
