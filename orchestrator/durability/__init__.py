"""Durability: the store protocol, the journal, replay, resume and retention."""
