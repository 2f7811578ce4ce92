"""radixtop.tui"""
