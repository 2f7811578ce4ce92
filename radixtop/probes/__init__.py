"""radixtop.probes"""
