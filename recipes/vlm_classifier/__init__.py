"""``python -m recipes.vlm_classifier.train``: an image classifier from a vision-language model (SFT)."""
