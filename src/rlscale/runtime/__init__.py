"""Pieces shared by both loops; knows nothing of language models or games."""
