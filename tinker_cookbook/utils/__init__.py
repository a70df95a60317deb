"""Small utilities shared by the cookbook's loops and recipes."""
