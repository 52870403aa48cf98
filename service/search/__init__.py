"""Batch plan search: every mesh shape and batch for a model on N devices, planned, ranked and written out."""
