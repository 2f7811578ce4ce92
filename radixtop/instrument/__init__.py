"""radixtop.instrument"""
