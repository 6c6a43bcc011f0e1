"""Filters: narrow the candidate list before scoring."""
