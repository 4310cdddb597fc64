"""The model catalog: metadata, effective-dated list prices, account rate overrides."""
