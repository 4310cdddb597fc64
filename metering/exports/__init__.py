"""Daily usage exports: per-account CSV and Parquet files and a manifest for each UTC day."""
