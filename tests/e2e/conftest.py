"""Shared e2e fixtures: the session's plain warm start (``plain_warm``) lives in tests/conftest.py, shared
with tests/cluster."""
