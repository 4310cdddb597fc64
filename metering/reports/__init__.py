"""The account usage report (docs/api.md#get-v1usage): ``GET /v1/usage``, read from the usage
rollups only."""
