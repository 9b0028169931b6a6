"""Network interfaces moved into a container's network namespace with its GPUs.

- `plan`: what may move and what reconcile does with each record (pure rules);
- `netlink`: the pyroute2 calls that list, move and configure interfaces;
- `namespaces`: the host's and a container's network namespace, opened and proven;
- `moves`: attach, detach and reconcile, each step written down first (`Netdevs`);
- `mounting`: a mount that brings an interface with its devices.
"""
