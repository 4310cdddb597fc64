"""The credit ledger, balances and credit holds."""
