"""Traces, and replaying and recording them: the format, the dispatcher, reuse and divergence."""
