"""Screens of the TUI: the main screen, a run's detail, and the dialogs."""
