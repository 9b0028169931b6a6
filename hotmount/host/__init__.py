"""The host as the engine reads it: containers resolved to PIDs and cgroups,
their liveness, the host root, and who holds a device open."""
