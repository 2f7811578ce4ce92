"""radixtop.sim"""
