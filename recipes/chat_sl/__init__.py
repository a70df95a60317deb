"""``python -m recipes.chat_sl.train``: supervised fine-tuning on chat datasets."""
