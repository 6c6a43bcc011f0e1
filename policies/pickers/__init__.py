"""Pickers: choose one backend, from the profile's scores or from backend state directly."""
