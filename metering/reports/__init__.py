"""The account usage report (contract §6): ``GET /v1/usage``, read from the usage rollups only."""
