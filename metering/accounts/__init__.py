"""Accounts and API keys (admin)."""
