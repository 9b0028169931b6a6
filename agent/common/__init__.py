"""What every use case shares, below them all: one lock per container, long work on a
container off the reconcile thread, which containers a request means, and engine results
as API schemas with their metrics and Events."""
