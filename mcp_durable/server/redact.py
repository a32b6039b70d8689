"""The face's name for the masked record views: they live in `mcp_durable/views.py` (no `mcp`
import, so the operator CLI prints the same views without loading the face); re-exported here."""

from __future__ import annotations

from ..views import (
    MASK,
    REDACTION_PROCESS,
    RESULT_MARK,
    Sensitive,
    SensitiveNames,
    iso,
    mask_arguments,
    mask_result,
    record_summary,
    record_view,
    scrub,
    sensitive_values,
    steps_view,
    task_status,
)

__all__ = [
    "MASK",
    "REDACTION_PROCESS",
    "RESULT_MARK",
    "Sensitive",
    "SensitiveNames",
    "iso",
    "mask_arguments",
    "mask_result",
    "record_summary",
    "record_view",
    "scrub",
    "sensitive_values",
    "steps_view",
    "task_status",
]
