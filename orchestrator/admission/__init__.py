"""Admission: who runs next and how much each backend takes, decided, not applied."""
