"""The problem statement of a prompt row, as the graders see it (the outcome judge, the process reward, the
teacher's prompt): read from the row's fields alone, so it sits with the rewards that ask for it."""
from __future__ import annotations


def problem_text(row) -> str:
    """The problem statement sent to the grader: ``extra_info.problem``, else ``extra_info.question``
    (the PAPO data's key), else the content of the row's last user message (``row``: a
    ``data.dataset.PromptRow`` or anything with its ``index``, ``extra_info`` and ``messages``)."""
    for key in ("problem", "question"):
        if row.extra_info.get(key):
            return str(row.extra_info[key])
    users = [m["content"] for m in row.messages if m.get("role") == "user"]
    if not users:
        raise ValueError(f"row {row.index}: no extra_info.problem/question and no user message to grade against")
    return str(users[-1])
