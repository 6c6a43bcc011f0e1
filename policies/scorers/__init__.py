"""Scorers: one score in [0, 1] per candidate, higher is better; weights live in the profile."""
