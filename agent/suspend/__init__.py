"""Suspend and resume a pod's GPUs, with the books, and the progress a caller
polls."""
