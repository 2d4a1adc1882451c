"""Engines turn chat requests into completions. They know nothing of tasks."""
