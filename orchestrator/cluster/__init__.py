"""Several engines on one store: leases, shared limits and wake-ups between processes."""
