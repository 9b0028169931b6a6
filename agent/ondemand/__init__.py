"""On-demand GPUs (issue 42): a notebook holds a GPU only while its cells run. So far the
pure rules: the pod's policy (policy.py) and the node's fair queue with the choice of a
GPU to suspend for a waiter (queue.py); the agent does not serve on-demand requests yet
(docs/notebooks.md says what works today)."""
