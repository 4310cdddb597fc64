"""Payments: customers add credit themselves, by card through Stripe (docs/api.md#payments).

``stripe_api`` is the one module that calls Stripe; ``flows`` makes payments and credits them
once; ``service`` reads them; ``endpoints`` holds the JSON routes and Stripe's webhook;
``portal`` the portal's Billing page.
"""
