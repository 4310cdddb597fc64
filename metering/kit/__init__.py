"""Shared helpers that are not domain rules."""
