"""The shared vocabulary: backends, their scraped state and the proxy's own accounting.

A leaf package: it imports none of proxy/, policies/, rescheduler/, planner/ or simulator/.
"""
