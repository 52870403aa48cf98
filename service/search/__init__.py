"""Batch plan search: candidates over mesh shapes and batches, ranked, with a report."""
