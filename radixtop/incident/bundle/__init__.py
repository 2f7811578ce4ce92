"""The evidence bundle: what the server and its logs showed, redacted, with a timeline."""
