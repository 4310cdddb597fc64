"""The audit log of operators' changes (§14)."""
