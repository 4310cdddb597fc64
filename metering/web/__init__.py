"""HTTP plumbing shared by every route: JSON in and out, errors, request ids, body limits."""
