"""The customer billing portal: server-rendered pages at /billing for an account's people."""
