"""Payments: customers add credit themselves, by card through Stripe (docs/api.md#payments).

``stripe_api`` is the one module that calls Stripe (imported only once a payment is made),
``stripe_records`` what its answers become; ``flows`` makes payments and credits them
once; ``service`` reads them; ``endpoints`` holds the JSON routes and Stripe's webhook;
``portal`` the portal's Billing page.
"""
