"""The live DAG page served at `/`: one HTML file, read once from the package."""

from __future__ import annotations

from importlib.resources import files

PAGE_HTML = files(__package__).joinpath("page.html").read_text(encoding="utf-8")
