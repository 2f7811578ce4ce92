"""radixtop.themes"""
