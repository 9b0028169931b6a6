"""The other agents: forwarding a call to the node that runs the pod, and the
cluster-wide list fanned out to every node and checked on return."""
