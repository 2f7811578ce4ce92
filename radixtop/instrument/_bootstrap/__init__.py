"""Put on PYTHONPATH by `python -m radixtop.instrument.launcher`; holds its sitecustomize.py."""
