"""Placing, releasing and expiring credit holds: the statements are defined once in
``program`` (the check-and-hold as the program ``PLACE_HOLDS``); ``sqlite`` runs them inside the
unit of work, ``postgres`` on the event loop with psycopg (group commit, remembered resolutions).
"""
