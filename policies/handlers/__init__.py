"""Profile handlers: which profiles run for a request, and how their picks become a Decision."""
