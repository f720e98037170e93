"""The tiny tool-template model (``tests/helpers/agent_fixture.py``), built once per session for the agent tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tool_model(tmp_path_factory):
    from tests.helpers.agent_fixture import build_tool_model

    return build_tool_model(tmp_path_factory.mktemp("tool_model"))
