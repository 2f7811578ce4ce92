"""Put on PYTHONPATH by `python -m radixtop.instrument.launch`; holds its sitecustomize.py."""
