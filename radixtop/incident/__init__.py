"""radixtop.incident"""
