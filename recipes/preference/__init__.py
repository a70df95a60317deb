"""Recipes that learn from pairwise preferences."""
