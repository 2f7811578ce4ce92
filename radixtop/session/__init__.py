"""radixtop.session: what the UI shows, kept without Textual.

The log pane's incident state (the ring, the ingestor, folded access lines), the history scan, the
live sources and the state they fold into (the radix board, the vital signs). Widgets read these;
`tui/` wires them to the screen; nothing here imports Textual.
"""
