"""radixtop.diagnosis"""
