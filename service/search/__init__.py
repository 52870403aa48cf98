"""Batch plan search: candidates over mesh shapes and batches, planned from one capture per configuration,
ranked, with a report."""
