"""The leaf layer: types, errors, paths, hashing, seeds and FP8 rounding. Imports nothing above it."""
