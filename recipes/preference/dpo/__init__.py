"""Direct Preference Optimization recipe."""
