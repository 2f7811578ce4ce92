"""radixtop.widgets"""
