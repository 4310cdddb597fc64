"""The audit log of operators' changes (docs/api.md#get-adminv1audit-events)."""
