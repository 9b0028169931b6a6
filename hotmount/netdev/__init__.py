"""Network interfaces moved into a container's network namespace with its GPUs.

- `plan`: what may move and what reconcile does with each record (pure rules);
- `netlink`: the pyroute2 calls that list, move and configure interfaces;
- `moves`: attach, detach and reconcile, each step written down first (`Netdevs`).
"""
