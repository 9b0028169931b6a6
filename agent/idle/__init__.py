"""Idle reclaim: the policy (pure), the clocks kept beside the ledger, the reclaim
pass, and the suspension it may choose instead."""
