"""Usage ingest: recording, pricing and aggregating the gateway's usage events."""
