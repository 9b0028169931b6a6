"""The engine's operations on one container: mount, unmount, status, reconcile,
their plans and kernel steps, and the read-only view of its books."""
